"""Uniform sampling, over everything or over each writer's newest trajectories."""

from __future__ import annotations

import numpy as np

from ..errors import EmptyBufferError
from ..numbers import as_int
from .contract import (
    Context,
    Drawn,
    Sampler,
    Units,
    draw_episode_weighted,
    draw_weighted,
    episode_ages,
    require_rows,
    uniform_within,
)

EMPTY = "Cannot sample from an empty buffer."  # require_rows's words


class Uniform(Sampler):
    """Every visible row (or clip, or n-step transition) equally likely, with replacement."""

    def draw_rows(self, ctx: Context, n: int) -> Drawn:
        lo, hi = ctx.space.lo, ctx.space.hi  # plain ints: the sampling path calls nothing more
        if hi <= lo:
            raise EmptyBufferError(EMPTY)
        return ctx.rng.integers(lo, hi, size=n), {}

    def draw_units(self, ctx: Context, units: Units, n: int) -> Drawn:
        return ctx.rng.integers(0, units.total, size=n), {}


class Window(Uniform):
    """Uniform over the rows of the last ``size`` trajectories (RLinf's
    ``sample_window_size``; ``size=0``: all of them, i.e. :class:`Uniform`).

    Row draws are exactly RLinf's (``rng.integers(lo, hi, n)`` over the window's rows).
    In a view over several writers' segments the window is the last ``size`` trajectories
    of *each* segment.  Clips and n-step transitions: those of the episodes that reach
    into the window (an episode's newest row lies in it), each equally likely.
    """

    def __init__(self, size: int):
        size = as_int(size, "Window size")
        if size < 0:
            raise ValueError(f"Window size must be >= 0 trajectories, got {size}")
        self.size = size

    def config(self) -> dict:
        return {"size": self.size}

    def draw_rows(self, ctx: Context, n: int) -> Drawn:
        sp = ctx.space
        if self.size == 0:  # Uniform's draw, written out: RLinf's default sample path
            lo, hi = sp.lo, sp.hi
        else:
            tails = [(g0, g1) for g0, g1 in sp.tails(self.size) if g1 > g0]
            if len(tails) != 1:
                require_rows(sp)
                g = np.concatenate([np.arange(g0, g1) for g0, g1 in tails])
                starts = sp.starts(g)
                sizes = sp.starts(g + 1) - starts
                pick = draw_weighted(ctx.rng, sizes.astype(np.float64), n)
                return starts[pick] + uniform_within(ctx.rng, sizes[pick]), {}
            lo, hi = int(sp.starts(tails[0][0])), int(sp.starts(tails[0][1]))
        if hi <= lo:
            raise EmptyBufferError(EMPTY)
        return ctx.rng.integers(lo, hi, size=n), {}

    def draw_units(self, ctx: Context, units: Units, n: int) -> Drawn:
        if self.size == 0:
            return super().draw_units(ctx, units, n)
        inside = (episode_ages(ctx.space, units) < self.size).astype(np.float64)
        return draw_episode_weighted(ctx.rng, units, inside, n), {}
