"""The buffer core: an engine (writer or reader), a bound sampler and a random stream.

Facades (``TrajectoryReplayBuffer``, ``ReplayBuffer``, views, the TorchRL storage) are
thin adapters of :class:`BufferCore`; see CONTRIBUTING.md ("A facade").
"""

from ..engine.ramtier import RamPolicy
from .buffer import BufferCore, Prepared, TrajectoryRecord
from .rate import MinSize, RateLimiter, SampleToInsertRatio
from .stream import RandomStream

__all__ = [
    "BufferCore",
    "MinSize",
    "Prepared",
    "RamPolicy",
    "RandomStream",
    "RateLimiter",
    "SampleToInsertRatio",
    "TrajectoryRecord",
]
