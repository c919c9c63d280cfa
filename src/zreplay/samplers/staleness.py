"""Staleness-aware sampling: rows produced by an old policy are dropped or down-weighted.

Asynchronous on-policy-ish training (async PPO, RLinf's version-keyed store, TorchRL's
``StalenessAwareSampler``) trains policy version ``V`` on rows that older versions
produced.  A row's *staleness* is ``V - version``; rows with staleness above
``max_staleness`` weigh ``stale_weight`` (0: never drawn), every other row weighs 1, and
rows are drawn with probability proportional to their weight, with replacement.

A row's version comes from a stored column (RLinf's per-step ``versions``, the smallest
value of the row when it has several) or, with ``version_of``, from its trajectory's
``model_weights_id`` (``version_of(model_weights_id) -> number``).  Versions are read once
per row, the first time a draw sees it (one batched read of the new rows' column), and
kept as runs of equal version per writer's segment, so a draw costs one cumulative sum
over runs (about one per trajectory and version), not one per row.

The current version ``V`` is passed at sample time (``sample(n, version=V)``) or set as
``sampler.current_version``; the last one used is saved with the buffer.  Without either,
``V`` is the newest version in the buffer.  Clips and n-step transitions weigh what their
start row weighs (drawn like ``Prioritized``'s: rows by weight, kept when they start a
unit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import EmptyBufferError
from ..numbers import as_float, as_int, as_optional_float
from .contract import (
    Context,
    Drawn,
    RowSpace,
    Sampler,
    Units,
    VisibleRows,
    draw_weighted,
    uniform_within,
)

_REJECTION_ROUNDS = 8


@dataclass
class _Runs:
    """One segment's row versions as runs: rows ``[start[i], start[i + 1])`` (the last run
    ends at ``high``) have version ``version[i]``; rows ``>= high`` were not read yet."""

    epoch: object
    high: int
    start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    version: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    next_traj: int = 0  # version_of: trajectories below this one are in the runs

    def append(self, rows_start: int, versions: np.ndarray) -> None:
        """Versions of rows ``[rows_start, rows_start + len(versions))`` (``rows_start``
        == ``high``), merged into runs."""
        if not len(versions):
            return
        cut = np.flatnonzero(versions[1:] != versions[:-1]) + 1
        starts = np.concatenate([[0], cut]) + rows_start
        vals = versions[np.concatenate([[0], cut])]
        if len(self.version) and self.version[-1] == vals[0] and self.high == rows_start:
            starts, vals = starts[1:], vals[1:]
        self.start = np.concatenate([self.start, starts.astype(np.int64)])
        self.version = np.concatenate([self.version, vals.astype(np.float64)])
        self.high = rows_start + len(versions)

    def trim(self, low: int) -> None:
        """Forget runs that end at or below row ``low`` (evicted rows)."""
        i = int(np.searchsorted(self.start, low, side="right")) - 1
        if i > 0:
            self.start, self.version = self.start[i:], self.version[i:]

    def visible(self, low: int, high: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(start rows, lengths, versions)`` of the runs clipped to rows ``[low, high)``."""
        high = min(high, self.high)
        if not len(self.start) or high <= low:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        i = max(int(np.searchsorted(self.start, low, side="right")) - 1, 0)
        j = int(np.searchsorted(self.start, high, side="left"))
        s = self.start[i:j].copy()
        ends = np.append(s[1:], high)
        s[0] = max(s[0], low)
        return s, ends - s, self.version[i:j]


class Staleness(Sampler):
    """Draw rows by how far their policy version lags the current one (see the module
    docstring).

    Args:
        max_staleness: rows whose version is more than this many versions behind the
            current one are *stale*.
        stale_weight: a stale row's weight relative to a fresh row's (0: never drawn).
        version_key: the stored column holding each row's policy version (RLinf's
            ``versions``, float ``[T, B, ...]``).
        version_of: instead of a column, ``fn(model_weights_id) -> version`` for each
            trajectory (e.g. ``int`` when ids are version numbers); not saved with the
            buffer (pass it again when reopening).
        current_version: the current policy version until a sample passes another.
        evict_stale: writable buffers with a ``capacity``: a trajectory that arrives
            stale while the buffer is full is dropped instead of evicting fresher ones
            (counted in ``num_dropped``); see docs/staleness.md.
    """

    def __init__(
        self,
        max_staleness: int,
        stale_weight: float = 0.0,
        *,
        version_key: str = "versions",
        version_of: Callable[[str], float] | None = None,
        current_version: float | None = None,
        evict_stale: bool = False,
    ):
        try:
            max_staleness = as_int(max_staleness, "max_staleness")
        except TypeError:
            max_staleness = as_float(max_staleness, "max_staleness")
        if not max_staleness >= 0:
            raise ValueError(
                f"max_staleness must be a number of versions >= 0, got {max_staleness}"
            )
        stale_weight = as_float(stale_weight, "stale_weight")
        if not 0.0 <= stale_weight <= 1.0:
            raise ValueError(f"stale_weight must lie in [0, 1], got {stale_weight}")
        if version_of is not None and not callable(version_of):
            raise TypeError("version_of must be a callable fn(model_weights_id) -> version")
        self.max_staleness = max_staleness
        self.stale_weight = float(stale_weight)
        self.version_key = str(version_key)
        self.version_of = version_of
        self.current_version = current_version
        self.evict_stale = bool(evict_stale)
        self.num_dropped = 0
        self._segs: dict[int, _Runs] = {}
        self._newest: float | None = None  # the newest version seen (stored or added)

    @property
    def current_version(self) -> float | None:
        """The policy version draws weigh rows against (a number, or None: the newest
        version in the buffer); set by ``sample(n, version=v)`` or assigned."""
        return self._current_version

    @current_version.setter
    def current_version(self, version) -> None:
        self._current_version = as_optional_float(version, "current_version")

    def config(self) -> dict:
        return {
            "max_staleness": self.max_staleness,
            "stale_weight": self.stale_weight,
            "version_key": self.version_key,
            "evict_stale": self.evict_stale,
        }

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "current_version": self.current_version,
            "num_dropped": self.num_dropped,
        }

    def unbound_copy(self) -> Staleness:
        new = Staleness(**self.config(), version_of=self.version_of)
        new.load_state_dict(self.state_dict())
        return new

    def load_state_dict(self, state: dict) -> None:
        if self.current_version is None:
            self.current_version = state.get("current_version")
        self.num_dropped = int(state.get("num_dropped", 0))

    # -- versions -------------------------------------------------------------------

    def _row_versions(self, space: RowSpace, seg: VisibleRows, lo: int, hi: int) -> np.ndarray:
        if space.read is None:
            raise TypeError("Staleness needs a buffer that can read its rows")
        try:
            got = space.read(self.version_key, seg.positions(np.arange(lo, hi, dtype=np.int64)))
        except KeyError:
            raise KeyError(
                f"Staleness: the buffer has no column {self.version_key!r} with policy "
                "versions; pass version_key=... (a stored key) or version_of=fn(model_weights_id)"
            ) from None
        got = np.asarray(got, np.float64)
        return got.reshape(len(got), -1).min(axis=1) if got.ndim > 1 else got

    def _sync(self, space: RowSpace, seg: VisibleRows) -> _Runs:
        cur = self._segs.get(seg.key)
        if cur is None or cur.epoch is not seg.epoch or seg.low_row > cur.high:
            cur = self._segs[seg.key] = _Runs(seg.epoch, seg.low_row)
            if seg.index is not None:
                cur.next_traj = int(np.searchsorted(seg.index.offsets, seg.low_row, "right")) - 1
        if len(cur.start) > 64 and cur.start[64] <= seg.low_row:
            cur.trim(seg.low_row)
        if seg.n_rows <= cur.high:
            return cur
        if self.version_of is None:
            versions = self._row_versions(space, seg, cur.high, seg.n_rows)
            cur.append(cur.high, versions)
            self._saw(versions)
            return cur
        idx = seg.index
        for j in range(max(cur.next_traj, 0), idx.n):
            a, b = int(idx.offsets[j]), int(idx.offsets[j + 1])
            if b > cur.high:
                v = float(self.version_of(idx.weights_id(j)))
                cur.append(max(a, cur.high), np.full(b - max(a, cur.high), v))
                self._saw(np.array([v]))
        cur.next_traj = idx.n
        return cur

    def runs(self, space: RowSpace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every visible row as runs: ``(first position, length, version)``."""
        got = []
        for seg in space.segments:
            s, ln, v = self._sync(space, seg).visible(seg.low_row, seg.n_rows)
            got.append((seg.positions(s), ln, v))
        if not got:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        return tuple(np.concatenate(c) for c in zip(*got, strict=True))

    def version_now(self, ctx: Context, versions: np.ndarray) -> float:
        """The current version of a draw (and remember it)."""
        if ctx.version is not None:
            self.current_version = ctx.version
        elif self.current_version is None:
            return float(versions.max()) if len(versions) else 0.0
        return float(self.current_version)

    def weight(self, staleness: np.ndarray) -> np.ndarray:
        """Weight (float64) of rows ``staleness`` versions behind the current one."""
        return np.where(np.asarray(staleness) > self.max_staleness, self.stale_weight, 1.0)

    def is_stale(self, versions: np.ndarray, current: float | None = None) -> bool:
        """Whether every one of ``versions`` is stale against ``current`` (default: the
        current version, else the newest version seen in the buffer or its adds; False
        when there is none yet)."""
        current = self.current_version if current is None else current
        current = self._newest if current is None else current
        if current is None or not len(versions):
            return False
        return bool(current - np.max(versions) > self.max_staleness)

    def _versions_of(self, item) -> np.ndarray:
        if self.version_of is not None:
            return np.array([float(self.version_of(item.model_weights_id))])
        col = item.columns.get(self.version_key)
        return np.zeros(0) if col is None else np.asarray(col, np.float64).ravel()

    def drops(self, item) -> bool:
        """``evict_stale``: a trajectory arriving stale at a full buffer is dropped rather
        than pushing fresher trajectories out (counted in ``num_dropped`` once the add
        went through)."""
        return self.evict_stale and self.is_stale(self._versions_of(item))

    def admitted(self, item, kept: bool) -> None:
        if not kept:
            self.num_dropped += 1
        elif self.current_version is None:
            self._saw(self._versions_of(item))

    def _saw(self, versions: np.ndarray) -> None:
        if len(versions):
            top = float(np.max(versions))
            self._newest = top if self._newest is None else max(self._newest, top)

    # -- drawing --------------------------------------------------------------------

    def _mass(self, ctx: Context):
        start, length, version = self.runs(ctx.space)
        if not len(start) or length.sum() <= 0:
            raise EmptyBufferError("Cannot sample from an empty buffer.")
        now = self.version_now(ctx, version)
        mass = length * self.weight(now - version)
        if not mass.sum() > 0:
            raise EmptyBufferError(
                f"nothing to sample: every row is more than max_staleness="
                f"{self.max_staleness} versions behind version {now:g} (newest row: version "
                f"{version.max():g}); add fresh trajectories, raise max_staleness or set "
                "stale_weight > 0"
            )
        return start, length, mass, now, version

    def draw_rows(self, ctx: Context, n: int) -> Drawn:
        start, length, mass, _, _ = self._mass(ctx)
        run = draw_weighted(ctx.rng, mass, n)
        return start[run] + uniform_within(ctx.rng, length[run]), {}

    def draw_units(self, ctx: Context, units: Units, n: int) -> Drawn:
        start, length, mass, now, version = self._mass(ctx)
        flat = np.full(n, -1, np.int64)
        todo = np.arange(n)
        for _ in range(_REJECTION_ROUNDS):
            run = draw_weighted(ctx.rng, mass, todo.size)
            f = units.from_rows(start[run] + uniform_within(ctx.rng, length[run]), ctx.rng)
            flat[todo[f >= 0]] = f[f >= 0]
            todo = todo[f < 0]
            if not todo.size:
                return flat, {}
        # Rejection kept missing: draw among the rows that start a unit (O(units)).
        pos = units.key_rows()
        run = np.maximum(np.searchsorted(start, pos, side="right") - 1, 0)
        inside = pos < start[run] + length[run]
        w = np.where(inside, self.weight(now - version[run]), 0.0)
        flat[todo] = units.from_rows(pos[draw_weighted(ctx.rng, w, todo.size)], ctx.rng)
        return flat, {}
