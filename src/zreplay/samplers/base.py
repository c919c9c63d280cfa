"""What a sampler author needs: subclass :class:`Sampler` (and :class:`PrioritySampler`
for priorities); a sampler sees the buffer's rows as a :class:`RowSpace` of segments
(:class:`VisibleRows`, formerly ``SegmentRows``), draws through a :class:`Context` and,
for episodes or clips, over :class:`Units`.  :class:`Hook` wraps a plain callable;
:func:`as_sampler` is what every buffer applies to its ``sampler=`` argument.  The
contract is documented in :mod:`zreplay.samplers.contract`."""

from .contract import (
    Context,
    PrioritySampler,
    RowSpace,
    Sampler,
    SegmentRows,
    Units,
    VisibleRows,
)
from .hook import Hook, as_sampler

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
