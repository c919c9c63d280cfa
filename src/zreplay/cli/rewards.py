"""The reward column of a buffer or an HDF5 episode file, per step and per episode
(``zreplay info`` summarises it, ``zreplay plot`` draws it).

The reward key is ``rewards`` (RLinf) or ``reward`` (stable-worldmodel); trailing
dimensions (RLinf's ``[C]`` action chunks) are summed per step.  A buffer's rewards are
read in blocks of rows (one batched read each), episodes in order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..conventions import REWARD_KEYS
from ..schema import flatten

BLOCK_ROWS = 1 << 20


def reward_key(keys) -> str | None:
    return next((k for k in REWARD_KEYS if k in keys), None)


def episode_returns(per_step: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Sum of ``per_step[s : s + n]`` for each episode (float64)."""
    c = np.concatenate([[0.0], np.cumsum(per_step, dtype=np.float64)])
    return c[starts + lengths] - c[starts]


def buffer_rewards(view, key: str, tick: Callable[[int], None] = lambda n: None):
    """``(per-step rewards [rows] float64, in episode order, lengths [episodes],
    returns [episodes])`` of a view's visible episodes."""
    episodes = view.episodes()
    lengths = np.asarray(episodes.length, np.int64)
    total = int(lengths.sum())
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    per_step = np.empty(total, np.float64)
    for lo in range(0, total, BLOCK_ROWS):
        hi = min(total, lo + BLOCK_ROWS)
        flat = np.arange(lo, hi)
        ep = np.searchsorted(starts, flat, side="right") - 1
        rows = episodes.rows(ep, flat - starts[ep])
        r = flatten(view.rows(rows, keys=[key]))[key]
        per_step[lo:hi] = r.reshape(len(r), -1).sum(axis=1, dtype=np.float64)
        tick(hi - lo)
    return per_step, lengths, episode_returns(per_step, starts, lengths)


def hdf5_rewards(f, dataset: str):
    """The same for an open HDF5 episode file (``dataset``: the reward column's name)."""
    r = f[dataset][:]
    per_step = r.reshape(len(r), -1).sum(axis=1, dtype=np.float64)
    lengths = f["ep_len"][:].astype(np.int64)
    return per_step, lengths, episode_returns(per_step, f["ep_offset"][:].astype(np.int64), lengths)


def summary(values: np.ndarray) -> dict[str, float] | None:
    if not len(values):
        return None
    return {
        "mean": float(values.mean()),
        "std": float(values.std()),
        "min": float(values.min()),
        "max": float(values.max()),
    }
