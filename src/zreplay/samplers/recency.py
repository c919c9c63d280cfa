"""Recency-weighted sampling: newer trajectories are drawn more often."""

from __future__ import annotations

import math

import numpy as np

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

# Trajectories older than this many half-lives weigh < 2**-60 of the newest: below what a
# float64 cumulative sum can tell apart, so they are not even looked at.
_HORIZON_HALF_LIVES = 60


class Recency(Sampler):
    """Every row weighs ``2 ** (-age / half_life)``, ``age`` being how many trajectories
    its writer added after the row's trajectory (0 for the newest); rows are drawn with
    probability proportional to their weight, with replacement.

    So a trajectory ``half_life`` trajectories older than another is drawn half as often
    per row.  Cost per draw: one cumsum over the last ``60 * half_life`` trajectories.
    Clips and n-step transitions weigh what the trajectory holding their episode's newest
    row weighs.  Views age each writer's segment separately.
    """

    def __init__(self, half_life: float):
        if not (math.isfinite(half_life) and half_life > 0):
            raise ValueError(
                f"half_life must be a positive number of trajectories, got {half_life}"
            )
        self.half_life = float(half_life)

    def config(self) -> dict:
        return {"half_life": self.half_life}

    def weight(self, age: np.ndarray) -> np.ndarray:
        """Weight ``float64`` of rows whose trajectory has age ``age``."""
        return np.exp2(-np.asarray(age, np.float64) / self.half_life)

    def draw_rows(self, ctx: Context, n: int) -> Drawn:
        sp = ctx.space
        require_rows(sp)
        horizon = max(1, math.ceil(_HORIZON_HALF_LIVES * self.half_life))
        g = np.concatenate([np.arange(g0, g1) for g0, g1 in sp.tails(horizon)])
        starts = sp.starts(g)
        sizes = sp.starts(g + 1) - starts
        pick = draw_weighted(ctx.rng, sizes * self.weight(sp.age(g)), n)
        return starts[pick] + uniform_within(ctx.rng, sizes[pick]), {}

    def draw_units(self, ctx: Context, units: Units, n: int) -> Drawn:
        w = self.weight(episode_ages(ctx.space, units))
        return draw_episode_weighted(ctx.rng, units, w, n), {}
