"""zreplay: a persistent, Zarr-backed trajectory replay buffer.

Public names:

* :class:`TrajectoryReplayBuffer`, :class:`Trajectory`: RLinf 0.3's API on a Zarr store.
* :class:`ReplayBuffer`: stable-worldmodel's episode buffer/Dataset, persistent.
* :func:`open`: a read-only, dataset-like view of a buffer directory.
* :func:`import_rlinf`: read an RLinf buffer directory into a zreplay buffer.
* :func:`verify`: check a buffer's commit records, index and chunk checksums.
* :mod:`zreplay.errors`: the exception hierarchy.
"""

from . import errors
from .errors import (
    BufferClosedError,
    CapacityError,
    CorruptBufferError,
    EmptyBufferError,
    EmptyTrajectoryError,
    FormatError,
    KeyNameError,
    PickleRefusedError,
    SchemaError,
    WriteFailedError,
    WriterLockedError,
)
from .rlinf.buffer import TrajectoryReplayBuffer
from .rlinf.files import import_rlinf
from .rlinf.trajectory import Trajectory
from .swm import ReplayBuffer
from .verify import VerifyReport, verify
from .view import BufferView, open

__version__ = "0.1.0"

__all__ = [
    "BufferClosedError",
    "BufferView",
    "CapacityError",
    "CorruptBufferError",
    "EmptyBufferError",
    "EmptyTrajectoryError",
    "FormatError",
    "KeyNameError",
    "PickleRefusedError",
    "ReplayBuffer",
    "SchemaError",
    "Trajectory",
    "TrajectoryReplayBuffer",
    "VerifyReport",
    "WriteFailedError",
    "WriterLockedError",
    "errors",
    "import_rlinf",
    "open",
    "verify",
]
