"""The buffer core: an engine (writer or reader), a bound sampler and a random stream.

:class:`BufferCore` is the read side every core shares; :meth:`BufferCore.writer` makes
a :class:`WritableCore`, :meth:`BufferCore.reader` a :class:`ViewCore`.  Facades
(``TrajectoryReplayBuffer``, ``ReplayBuffer``, views, the TorchRL storage) are thin
adapters of them; see CONTRIBUTING.md ("A facade").
"""

from ..engine.ramtier import RamPolicy
from ..engine.sealed import OFFLINE_WRITER, seal
from .buffer import BufferCore, Prepared, TrajectoryRecord
from .rate import MinSize, RateLimiter, SampleToInsertRatio
from .stream import RandomStream
from .view import ViewCore
from .writable import WritableCore

__all__ = [
    "OFFLINE_WRITER",
    "BufferCore",
    "MinSize",
    "Prepared",
    "RamPolicy",
    "RandomStream",
    "RateLimiter",
    "SampleToInsertRatio",
    "TrajectoryRecord",
    "ViewCore",
    "WritableCore",
    "seal",
]
