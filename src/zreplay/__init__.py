"""zreplay: a persistent, Zarr-backed trajectory replay buffer.

Public names:

* :class:`TrajectoryReplayBuffer`, :class:`Trajectory`: RLinf 0.3's API on a Zarr store.
* :class:`ReplayBuffer`: stable-worldmodel's episode buffer/Dataset, persistent.
* :func:`open`: a read-only, dataset-like view of a buffer directory.
* :class:`ClipDataset`, :class:`ReplayDataset`: PyTorch datasets over buffers and views.
* :func:`rank_loader`, :class:`RankShard`: one distributed rank's share as a DataLoader.
* :func:`dump`, :func:`load_hdf5`, :func:`iter_hdf5`: episode exports (HDF5, Zarr).
* :func:`import_rlinf`: read an RLinf buffer directory into a zreplay buffer.
* :func:`import_lerobot`: read a local LeRobot dataset (v3.0, v2.1) into a new buffer
  (outside ``__all__``, which holds 20 names).
* :func:`export_lerobot`: a buffer's whole episodes as a LeRobot v3.0 dataset.
* :func:`import_minari`: a Minari HDF5 dataset into a new zreplay buffer.
* :func:`seal`: make a segment a buffer's immutable offline part (imports seal theirs).
* :func:`verify`: check a buffer's commit records, index and chunk checksums.
* :func:`upgrade`: rewrite a buffer of an older on-disk format (2-4) in the current one.
* :mod:`zreplay.samplers`: ``Uniform``, ``Window``, ``Recency``, ``Prioritized``,
  ``PrioritizedClips``, ``Staleness`` (``sampler=`` of every buffer and view).
* :class:`MinSize`, :class:`SampleToInsertRatio`: Reverb-style rate limiters between the
  writers and learners of a shared buffer (``rate_limiter=``).
* :class:`StoreOptions`: the store options every writable buffer takes (``writer_id``,
  ``durable``, ``overwrite``, ``storage_options``, ``rate_limiter``, ...).
* :mod:`zreplay.errors`: the exceptions (also importable from ``zreplay``).
* :mod:`zreplay.core`: the buffer core the facades are built on (for new facades).
"""

from . import errors as errors
from . import samplers as samplers
from .api.episode_buffer import ReplayBuffer
from .api.imports import import_rlinf, load_hdf5
from .api.torch_data import ClipDataset, RankShard, ReplayDataset, rank_loader
from .api.trajectory_buffer import TrajectoryReplayBuffer
from .api.view import BufferView, open
from .compat.dumps import dump
from .compat.hdf5 import iter_hdf5
from .compat.lerobot import import_lerobot as import_lerobot  # outside __all__ (20 names)

# Other projects' datasets, outside __all__ (20 names) as upgrade.
from .compat.lerobot_export import export_lerobot as export_lerobot
from .compat.minari import import_minari as import_minari
from .compat.rlinf_trajectory import Trajectory
from .compat.swm_episode import classic_filter
from .core.options import StoreOptions
from .core.rate import MinSize, RateLimiter, SampleToInsertRatio
from .engine.sealed import seal as seal  # outside __all__ (20 names), as upgrade

# The exceptions live in zreplay.errors; their old import paths (``from zreplay import
# CorruptBufferError``) keep working, outside __all__.
from .errors import AppendOnlyError as AppendOnlyError
from .errors import BufferClosedError as BufferClosedError
from .errors import CapacityError as CapacityError
from .errors import CorruptBufferError as CorruptBufferError
from .errors import DestinationError as DestinationError
from .errors import DeviceUnavailableError as DeviceUnavailableError
from .errors import EmptyBufferError as EmptyBufferError
from .errors import EmptyTrajectoryError as EmptyTrajectoryError
from .errors import FormatError as FormatError
from .errors import HandoffError as HandoffError
from .errors import KeyNameError as KeyNameError
from .errors import MainGuardError as MainGuardError
from .errors import MissingCodecError as MissingCodecError
from .errors import NoSuchBucketError as NoSuchBucketError
from .errors import PickleRefusedError as PickleRefusedError
from .errors import RateLimitTimeout as RateLimitTimeout
from .errors import ReadOnlyError as ReadOnlyError
from .errors import SchemaError as SchemaError
from .errors import SealedSegmentError as SealedSegmentError
from .errors import StackError as StackError
from .errors import StaleViewError as StaleViewError
from .errors import WriteFailedError as WriteFailedError
from .errors import WriterLockedError as WriterLockedError
from .errors import ZReplayError as ZReplayError
from .store.upgrade import upgrade as upgrade  # a maintenance call, outside __all__ (20 names)
from .store.verify import VerifyReport, verify

__version__ = "0.1.0"

__all__ = [
    "BufferView",
    "ClipDataset",
    "MinSize",
    "RateLimiter",
    "RankShard",
    "ReplayBuffer",
    "ReplayDataset",
    "SampleToInsertRatio",
    "StoreOptions",
    "Trajectory",
    "TrajectoryReplayBuffer",
    "VerifyReport",
    "classic_filter",
    "dump",
    "import_rlinf",
    "iter_hdf5",
    "load_hdf5",
    "open",
    "rank_loader",
    "verify",
]
