"""``zreplay.samplers``: pass one as ``sampler=`` to any buffer or view.

* :class:`Uniform`: every row (clip, transition) equally likely;
* :class:`Window`: uniform over the last ``size`` trajectories (RLinf's ``sample_window_size``);
* :class:`Recency`: weight halves every ``half_life`` trajectories of age;
* :class:`Prioritized`: proportional prioritized replay (batches carry ``index``/``weight``;
  feed ``update_priorities``); priorities are saved with the buffer;
* :class:`PrioritizedClips`: the same over clip start positions (sequence replay);
* :class:`Mixed`: an exact fraction of each batch from the buffer's sealed (offline) rows,
  constant or annealed, the rest from its online rows;
* :class:`Staleness`: drops or down-weights rows whose policy version lags the current one;
* any callable ``fn(step, buffer, batch_size, history_len) -> indices``.

Writing a sampler of your own: subclass :class:`zreplay.samplers.base.Sampler` (the types
a sampler author needs live in :mod:`zreplay.samplers.base`; the contract is documented
in :mod:`zreplay.samplers.contract`).  A new way of sampling is a new sampler (one file
here), never a new buffer class.  This package is the sampling layer's: the buffer core
binds a sampler, the engine never sees one.  ``zreplay.sampling.samplers`` is its older
path.
"""

# Sampler-author names stay importable from here (older code did so); they are documented
# in zreplay.samplers.base.
from .base import Context as Context
from .base import Hook as Hook
from .base import PrioritySampler as PrioritySampler
from .base import RowSpace as RowSpace
from .base import Sampler as Sampler
from .base import SegmentRows as SegmentRows
from .base import Units as Units
from .base import VisibleRows as VisibleRows
from .base import as_sampler as as_sampler
from .mixed import Mixed
from .prioritized import Prioritized, PrioritizedClips
from .recency import Recency
from .staleness import Staleness
from .uniform import Uniform, Window

__all__ = ["Mixed", "Prioritized", "PrioritizedClips", "Recency", "Staleness", "Uniform", "Window"]
