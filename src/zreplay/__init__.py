"""zreplay: a persistent, Zarr-backed trajectory replay buffer.

Public names:

* :class:`TrajectoryReplayBuffer`, :class:`Trajectory`: RLinf 0.3's API on a Zarr store.
* :class:`ReplayBuffer`: stable-worldmodel's episode buffer/Dataset, persistent.
* :func:`open`: a read-only, dataset-like view of a buffer directory.
* :class:`ClipDataset`, :class:`ReplayDataset`: PyTorch datasets over buffers and views.
* :func:`rank_loader`, :class:`RankShard`: one distributed rank's share as a DataLoader.
* :func:`dump`, :func:`load_hdf5`, :func:`iter_hdf5`: episode exports (HDF5, Zarr).
* :func:`import_rlinf`: read an RLinf buffer directory into a zreplay buffer.
* :func:`verify`: check a buffer's commit records, index and chunk checksums.
* :mod:`zreplay.samplers`: ``Uniform``, ``Window``, ``Recency``, ``Prioritized``,
  ``PrioritizedClips`` (``sampler=`` of every buffer and view).
* :mod:`zreplay.errors`: the exception hierarchy.
* :mod:`zreplay.core`: the buffer core the facades are built on (for new facades).
"""

from . import errors, samplers
from .api.episode_buffer import ReplayBuffer
from .api.imports import import_rlinf, load_hdf5
from .api.torch_data import ClipDataset, RankShard, ReplayDataset, rank_loader
from .api.trajectory_buffer import TrajectoryReplayBuffer
from .api.view import BufferView, open
from .compat.dumps import dump
from .compat.hdf5 import iter_hdf5
from .compat.rlinf_trajectory import Trajectory
from .compat.swm_episode import classic_filter
from .errors import (
    BufferClosedError,
    CapacityError,
    CorruptBufferError,
    DestinationError,
    EmptyBufferError,
    EmptyTrajectoryError,
    FormatError,
    KeyNameError,
    PickleRefusedError,
    SchemaError,
    WriteFailedError,
    WriterLockedError,
)
from .store.verify import VerifyReport, verify

__version__ = "0.1.0"

__all__ = [
    "BufferClosedError",
    "BufferView",
    "ClipDataset",
    "CapacityError",
    "CorruptBufferError",
    "DestinationError",
    "EmptyBufferError",
    "EmptyTrajectoryError",
    "FormatError",
    "KeyNameError",
    "PickleRefusedError",
    "RankShard",
    "ReplayBuffer",
    "ReplayDataset",
    "SchemaError",
    "Trajectory",
    "TrajectoryReplayBuffer",
    "VerifyReport",
    "WriteFailedError",
    "WriterLockedError",
    "errors",
    "samplers",
    "classic_filter",
    "dump",
    "import_rlinf",
    "iter_hdf5",
    "load_hdf5",
    "open",
    "rank_loader",
    "verify",
]
