"""Samplers: which rows, clips or n-step transitions a batch reads.

Pass one as ``sampler=`` to :class:`~zreplay.TrajectoryReplayBuffer`,
:class:`~zreplay.ReplayBuffer` or :func:`zreplay.open`; a new way of sampling is a new
sampler, never a new buffer class.  Built-ins:

* :class:`Uniform`: every row (clip, transition) equally likely;
* :class:`Window`: uniform over the last ``size`` trajectories (RLinf's ``sample_window_size``);
* :class:`Recency`: weight halves every ``half_life`` trajectories of age;
* :class:`Prioritized`: proportional prioritized replay (batches carry ``index``/``weight``;
  feed ``update_priorities``); priorities are saved with the buffer;
* :class:`PrioritizedClips`: the same over clip start positions (sequence replay);
* :class:`Staleness`: drops or down-weights rows whose policy version lags the current one;
* any callable ``fn(step, buffer, batch_size, history_len) -> indices`` (:class:`Hook`).

The contract a sampler implements is in :mod:`zreplay.sampling.samplers.base`; the public
names are re-exported as :mod:`zreplay.samplers`.
"""

from __future__ import annotations

from .base import Context, RowSpace, Sampler, SegmentRows, Units, VisibleRows
from .hook import Hook
from .prioritized import Prioritized, PrioritizedClips
from .recency import Recency
from .staleness import Staleness
from .uniform import Uniform, Window


def as_sampler(sampler, default: Sampler | None = None) -> Sampler:
    """A :class:`Sampler` for what a buffer was given: a sampler as is, a callable wrapped
    in :class:`Hook`, ``None`` as ``default`` (:class:`Uniform` if not given)."""
    if sampler is None:
        return default if default is not None else Uniform()
    if isinstance(sampler, Sampler):
        return sampler
    if isinstance(sampler, type) and issubclass(sampler, Sampler):
        raise TypeError(f"pass a sampler instance, e.g. sampler={sampler.__name__}(...)")
    return Hook(sampler)


__all__ = [
    "Context",
    "Hook",
    "Prioritized",
    "PrioritizedClips",
    "Recency",
    "RowSpace",
    "Sampler",
    "SegmentRows",
    "Staleness",
    "Uniform",
    "Units",
    "VisibleRows",
    "Window",
    "as_sampler",
]
