"""LeRobot's statistics of a feature (``stats/<feature>/...`` per episode, and
``meta/stats.json`` over all of them), for :mod:`zreplay.compat.lerobot_export`: min,
max, mean, std, count and the quantiles LeRobot 0.4.4 writes (q01, q10, q50, q90, q99)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .lerobot_format import Feature

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
# Camera stats are estimated, as LeRobot 0.4.4 does (compute_stats.sample_images), on
# 100 frames of an episode, each strided down to about 150 pixels a side when larger.
STATS_FRAMES = 100
STATS_SIDE = 150


def feature_stats(f: Feature, v: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's per-episode stats of ``v`` (``[n, *shape]``): min, max, mean, std,
    count and the quantiles q01..q99, each of the feature's shape (of its last axis for
    a row of several; a camera's: :func:`camera_stats`)."""
    if f.is_frame:
        return camera_stats(f, v)
    n = len(v)
    # LeRobot reduces every axis but the last of a row of several axes (its running
    # stats take [..., last] batches): stats of shape [last], count the frames.
    shape = f.shape if len(f.shape) == 1 else f.shape[-1:]
    rows = v.reshape(-1, shape[0])
    px = rows.astype(np.float64)
    lo, hi = rows.min(axis=0), rows.max(axis=0)
    if f.dtype != np.bool_:
        kind = np.float64 if v.dtype.kind == "f" else np.int64
        lo, hi = lo.astype(kind), hi.astype(kind)
    qs = np.quantile(px, list(QUANTILES.values()), axis=0)
    stats = {"min": lo, "max": hi, "mean": px.mean(axis=0), "std": px.std(axis=0)}
    stats.update(zip(QUANTILES, qs, strict=True))
    stats = {k: np.asarray(x).reshape(shape) for k, x in stats.items()}
    return {**stats, "count": np.array([n], np.int64)}


def camera_stats(f: Feature, v: np.ndarray) -> dict[str, np.ndarray]:
    """A camera's stats per channel, ``(C, 1, 1)``, of pixels scaled to [0, 1], on the
    frames LeRobot samples (at least 100 of an episode, evenly spaced) strided as it
    strides them (frames of 300 pixels a side or more, down to about 150).  From each
    channel's histogram of uint8 values: exact, and np.quantile's linear quantiles."""
    n, (h, w, c) = len(v), f.shape
    pick = np.unique(np.linspace(0, n - 1, min(n, STATS_FRAMES)).round().astype(np.int64))
    side = max(h, w)
    step = side // STATS_SIDE if side >= 2 * STATS_SIDE else 1
    px = v[pick, ::step, ::step].reshape(-1, c)
    counts = np.stack([np.bincount(px[:, k], minlength=256) for k in range(c)])  # [C, 256]
    values = np.arange(256) / 255.0
    total = len(px)
    mean = counts @ values / total
    var = np.maximum(counts @ values**2 / total - mean**2, 0.0)
    seen = counts > 0
    stats = {
        "min": values[seen.argmax(axis=1)],
        "max": values[255 - seen[:, ::-1].argmax(axis=1)],
        "mean": mean,
        "std": np.sqrt(var),
    }
    cum = np.cumsum(counts, axis=1)
    for name, q in QUANTILES.items():
        pos = q * (total - 1)
        k0 = int(np.floor(pos))
        k1 = min(k0 + 1, total - 1)
        at = [values[[np.searchsorted(cum[ch], k, "right") for k in (k0, k1)]] for ch in range(c)]
        stats[name] = np.array([a + (pos - k0) * (b - a) for a, b in at])
    stats = {k: x.reshape(c, 1, 1) for k, x in stats.items()}
    return {**stats, "count": np.array([n], np.int64)}


class Totals:
    """One feature's stats over all episodes so far, kept as running sums (memory does
    not grow with the episodes): exact min, max, mean, std (pooled) and count;
    quantiles as the count-weighted mean of the episodes' (as LeRobot aggregates them)."""

    def __init__(self):
        self.n = 0
        self.sums: dict[str, np.ndarray] = {}
        self.lo = self.hi = None

    def add(self, stats: dict[str, np.ndarray]) -> None:
        n = int(stats["count"][0])
        mean, std = stats["mean"], stats["std"]
        parts = {"mean": mean, "second": std**2 + mean**2}
        parts.update({q: stats[q] for q in QUANTILES})
        for k, v in parts.items():
            self.sums[k] = self.sums.get(k, 0) + n * v
        self.lo = stats["min"] if self.lo is None else np.minimum(self.lo, stats["min"])
        self.hi = stats["max"] if self.hi is None else np.maximum(self.hi, stats["max"])
        self.n += n

    def result(self) -> dict[str, np.ndarray]:
        mean = self.sums["mean"] / self.n
        var = np.maximum(self.sums["second"] / self.n - mean**2, 0.0)
        out = {"min": self.lo, "max": self.hi, "mean": mean, "std": np.sqrt(var)}
        out["count"] = np.array([self.n], np.int64)
        out.update({q: self.sums[q] / self.n for q in QUANTILES})
        return out


def nested(stats: dict[str, np.ndarray]) -> dict[str, Any]:
    return {k: v.tolist() for k, v in stats.items()}
