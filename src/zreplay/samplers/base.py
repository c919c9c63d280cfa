"""What a sampler author needs: subclass :class:`Sampler` (and :class:`PrioritySampler`
for priorities); a sampler sees the buffer's rows as a :class:`RowSpace` of segments
(:class:`VisibleRows`, formerly ``SegmentRows``), draws through a :class:`Context` and, for episodes or clips, over
:class:`Units`.  :class:`Hook` wraps a plain callable; :func:`as_sampler` is what every
buffer applies to its ``sampler=`` argument.  The contract is documented in
:mod:`zreplay.sampling.samplers.base`."""

from ..sampling.samplers import as_sampler
from ..sampling.samplers.base import (
    Context,
    PrioritySampler,
    RowSpace,
    Sampler,
    SegmentRows,
    Units,
    VisibleRows,
)
from ..sampling.samplers.hook import Hook

__all__ = [
    "Context",
    "Hook",
    "PrioritySampler",
    "RowSpace",
    "Sampler",
    "SegmentRows",
    "Units",
    "VisibleRows",
    "as_sampler",
]
