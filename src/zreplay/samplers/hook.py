"""Any callable ``fn(step, buffer, batch_size, history_len) -> indices`` as a sampler
(stable-worldmodel's sampler hook), and :func:`as_sampler`: what a buffer's ``sampler=``
argument becomes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .contract import Context, Drawn, Sampler, Units, require_rows
from .uniform import Uniform


class Hook(Sampler):
    """Wraps ``fn(step, buffer, batch_size, history_len)``, which returns ``batch_size``
    flat indices: clip (or n-step transition) indices in ``[0, num_units)`` for unit
    draws, row positions in ``[0, num_rows)`` (oldest visible row first) for row draws,
    where ``history_len`` is 1.  ``step`` is the buffer's step counter (batches drawn so
    far, or the ``step=`` a caller passed)."""

    def __init__(self, fn: Callable):
        if not callable(fn):
            raise TypeError(f"a sampler must be a zreplay.samplers.Sampler or callable, got {fn!r}")
        self.fn = fn

    def config(self) -> dict:
        return {"fn": getattr(self.fn, "__qualname__", repr(self.fn))}

    def unbound_copy(self) -> Hook:
        return Hook(self.fn)

    def _call(self, ctx: Context, n: int, history_len: int) -> np.ndarray:
        idx = np.asarray(self.fn(ctx.step, ctx.buffer, n, history_len))
        if idx.shape != (n,):
            raise ValueError(f"sampler returned shape {idx.shape}, expected ({n},)")
        return idx.astype(np.int64, copy=False)

    def draw_rows(self, ctx: Context, n: int) -> Drawn:
        require_rows(ctx.space)
        idx = self._call(ctx, n, 1)
        total = ctx.space.num_rows
        if len(idx) and (idx.min() < 0 or idx.max() >= total):
            raise IndexError(f"row index out of range [0, {total})")
        return idx, {}

    def draw_units(self, ctx: Context, units: Units, n: int) -> Drawn:
        idx = self._call(ctx, n, units.history_len)
        if len(idx) and (idx.min() < 0 or idx.max() >= units.total):
            raise IndexError(f"{units.name} index out of range [0, {units.total})")
        return idx, {}


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
