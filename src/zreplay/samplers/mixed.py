"""Offline-to-online mixing: an exact fraction of every batch from a buffer's sealed rows.

A buffer seeded from a dataset (``import_lerobot``, ``import_minari``, or any segment
``zreplay.seal`` sealed) keeps the seeded episodes as sealed segments; a writer of another
segment appends online data beside them (FORMAT.md "Sealed segments").  :class:`Mixed`
draws each batch of ``n`` units (rows, clips, n-step transitions) as exactly
``round(f * n)`` from the sealed (offline) segments and the rest from the others (online),
each side by the rule of the sampler it wraps (uniform by default), as TorchRL's
``OfflineToOnlineReplayBuffer`` does.  The first ``round(f * n)`` of a batch are the
offline ones.  ``f`` is a constant or anneals linearly from ``offline`` to ``end`` over
``steps`` batches; its clock is the buffer's step (batches drawn, or the ``step`` a caller
passes), which every commit and checkpoint saves with the sampler's state, so a reopened
or resumed buffer continues the schedule.

When one side has nothing to draw (no sealed segment yet, an online segment still empty,
or no clip fits that side's episodes) the whole batch comes from the other side.  Clips
and n-step windows never cross an episode, so they never cross from one side to the other.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..numbers import as_float, as_int
from .contract import Context, Drawn, RowSpace, Sampler, Units, uniform_within
from .hook import Hook
from .uniform import Uniform


def _fraction(value, name: str) -> float:
    f = as_float(value, name)  # numpy and torch scalars are numbers; bools are refused
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"{name} must be a fraction in [0, 1], got {f}")
    return f


class Mixed(Sampler):
    """Exactly ``round(f * n)`` of each batch of ``n`` from the sealed (offline) rows, the
    rest from the online rows, each side drawn by ``sampler`` (default
    :class:`~zreplay.samplers.Uniform`; any built-in without priorities, or your own
    :class:`~zreplay.samplers.base.Sampler` subclass).

    ``offline``: the fraction ``f`` (a number in ``[0, 1]``); with ``end`` and ``steps``,
    ``f`` goes linearly from ``offline`` at step 0 to ``end`` at step ``steps`` and stays
    there (:meth:`fraction`).  RLPD's symmetric sampling is ``Mixed(0.5)``.
    """

    def __init__(self, offline=0.5, sampler: Sampler | None = None, *, end=None, steps=None):
        self.offline = _fraction(offline, "Mixed offline fraction")
        if (end is None) != (steps is None):
            raise ValueError("Mixed: give both end= and steps= for a schedule, or neither")
        self.end = None if end is None else _fraction(end, "Mixed end fraction")
        self.steps = None if steps is None else as_int(steps, "Mixed steps", minimum=1)
        inner = Uniform() if sampler is None else sampler
        if not isinstance(inner, Sampler) or isinstance(inner, Hook | Mixed):
            raise TypeError(
                f"Mixed wraps a zreplay sampler (Uniform, Window, Recency, Staleness, or a "
                f"Sampler subclass), got {type(inner).__name__}: a hook draws over every "
                "row at once, so it cannot draw one side"
            )
        if inner.prioritized:
            raise TypeError(
                f"Mixed cannot wrap {type(inner).__name__}: priorities are kept over every "
                "row, and a side drawn on its own would not follow them; use Uniform, "
                "Window, Recency or Staleness inside Mixed"
            )
        self.sampler = inner
        self.clips = inner.clips
        self._sides: tuple | None = None  # (space, offline side, online side)
        self._plan: tuple | None = None  # (key, first positions, sizes) of a uniform batch

    def fraction(self, step: int) -> float:
        """The offline fraction at ``step`` (batches drawn before it)."""
        if self.end is None:
            return self.offline
        t = min(max(int(step), 0) / self.steps, 1.0)
        return self.offline + (self.end - self.offline) * t

    def split(self, n: int, step: int) -> int:
        """How many of a batch of ``n`` are offline at ``step``: ``round(f * n)``."""
        return int(round(self.fraction(step) * n))

    # -- draws ----------------------------------------------------------------------

    def draw_rows(self, ctx: Context, n: int) -> Drawn:
        off, on = self._split_space(ctx.space)
        if off is None or on is None:  # one side only: the sampler draws it as it is
            return self.sampler.draw_rows(ctx, n)
        k = self.split(n, ctx.step)
        if type(self.sampler) is Uniform and len(off.spans) == len(on.spans) == 1:
            # Each side one range of positions: one draw of the whole batch.
            key = (off.spans[0], on.spans[0], n, k)
            plan = self._plan  # one read: another thread may replace it meanwhile
            if plan is None or plan[0] != key:
                (lo0, hi0), (lo1, hi1) = key[:2]
                first = np.arange(n) < k
                plan = (key, np.where(first, lo0, lo1), np.where(first, hi0 - lo0, hi1 - lo1))
                self._plan = plan
            return plan[1] + uniform_within(ctx.rng, plan[2]), {}
        parts = []
        for side, m in ((off, k), (on, n - k)):
            if m:
                side_ctx = Context(ctx.rng, side.space, ctx.step, ctx.buffer, ctx.version)
                rows, extra = self.sampler.draw_rows(side_ctx, m)
                parts.append((side.positions(np.asarray(rows, np.int64)), extra))
        return _joined(parts)

    def draw_units(self, ctx: Context, units: Units, n: int) -> Drawn:
        sealed = _sealed_episodes(ctx.space, units)
        off, on = _masked(units, sealed), _masked(units, ~sealed)
        if not (off[0].total and on[0].total):  # every unit is on one side
            return self.sampler.draw_units(ctx, units, n)
        k = self.split(n, ctx.step)
        parts = []
        for (side, cum), m in ((off, k), (on, n - k)):
            if m:
                flat, extra = self.sampler.draw_units(ctx, side, m)
                parts.append((_unmasked(units, side, cum, np.asarray(flat, np.int64)), extra))
        return _joined(parts)

    def _split_space(self, space):
        """``(offline, online)`` sides of ``space`` (None: that side has no rows), made
        once per row space (a writer's and a view's are kept until their rows change)."""
        got = self._sides
        if got is None or got[0] is not space:
            got = self._sides = (space, _Side.of(space, True), _Side.of(space, False))
        return got[1], got[2]

    # -- what a buffer calls beside draws ------------------------------------------

    def drops(self, item) -> bool:
        return self.sampler.drops(item)

    def admitted(self, item, kept: bool) -> None:
        self.sampler.admitted(item, kept)

    def config(self) -> dict:
        out = {"offline": self.offline, "sampler": self.sampler.state_dict()}
        if self.end is not None:
            out.update(end=self.end, steps=self.steps)
        return out

    def load_state_dict(self, state: dict) -> None:
        inner = state.get("sampler")
        if isinstance(inner, dict) and inner.get("kind") == type(self.sampler).__name__:
            self.sampler.load_state_dict(dict(inner))

    def unbound_copy(self) -> Mixed:
        return Mixed(self.offline, self.sampler.unbound_copy(), end=self.end, steps=self.steps)

    def __repr__(self) -> str:
        sched = "" if self.end is None else f", end={self.end!r}, steps={self.steps!r}"
        return f"Mixed(offline={self.offline!r}, sampler={self.sampler!r}{sched})"


class _Side:
    """The rows of one side (the sealed segments, or the others) as a row space of their
    own, positions ``[0, rows)``; :meth:`positions` maps its draws back."""

    __slots__ = ("space", "_sub_first", "_shift", "spans")

    def __init__(self, space, sub_first: np.ndarray, shift: np.ndarray):
        self.space, self._sub_first, self._shift = space, sub_first, shift
        self.spans: list[tuple[int, int]] = []  # its ranges of positions in the whole space

    @classmethod
    def of(cls, space, sealed: bool) -> _Side | None:
        b, offs = space.bounds, space.offsets
        chosen = [
            i
            for i, s in enumerate(space.segments)
            if bool(s.sealed) == sealed and s.n_rows > s.low_row
        ]
        if not chosen:
            return None
        pieces, segs, counts, firsts, shifts, at = [], [], [], [], [], 0
        for i in chosen:
            s = space.segments[i]
            pieces.append(offs[b[i] : b[i + 1]] - s.first + at)
            segs.append(dataclasses.replace(s, first=at))
            counts.append(int(b[i + 1] - b[i]))
            firsts.append(at)
            shifts.append(s.first - at)
            at += s.n_rows - s.low_row
        sub_first, shift = np.array(firsts, np.int64), np.array(shifts, np.int64)
        side = cls(None, sub_first, shift)
        for i in chosen:  # adjacent segments make one span
            s = space.segments[i]
            lo, hi = s.first, s.first + s.n_rows - s.low_row
            if side.spans and side.spans[-1][1] == lo:
                lo = side.spans.pop()[0]
            side.spans.append((int(lo), int(hi)))

        def read(key: str, pos: np.ndarray) -> np.ndarray:
            return space.read(key, side.positions(pos))

        side.space = RowSpace(
            np.concatenate([*pieces, [at]]).astype(np.int64),
            np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            segs,
            None if space.read is None else read,
        )
        return side

    def positions(self, sub: np.ndarray) -> np.ndarray:
        """Positions in the whole space of this side's positions ``sub``."""
        if len(self._shift) == 1:
            return sub + self._shift[0]
        return sub + self._shift[np.searchsorted(self._sub_first, sub, side="right") - 1]


def _sealed_episodes(space, units: Units) -> np.ndarray:
    """Whether each episode of ``units`` lies in a sealed segment, bool[E] (kept with
    the episode view)."""

    def find() -> np.ndarray:
        v = units.view
        segs = space.segments
        sealed = np.array([bool(s.sealed) for s in segs] + [False])
        firsts = np.array([s.first for s in segs], np.int64)
        if not len(v) or not sealed.any():
            return np.zeros(len(v), bool)
        starts = v.rows(np.arange(len(v)), np.zeros(len(v), np.int64))
        return sealed[np.searchsorted(firsts, starts, side="right") - 1]

    return units.view.cached(("sealed_episodes",), find)


def _masked(units: Units, keep: np.ndarray) -> tuple[Units, np.ndarray]:
    """``units`` with the episodes ``keep`` does not mark given no units (and the
    inclusive cumsum of what is left)."""
    counts = np.where(keep, units.counts, 0)
    cum = np.cumsum(counts)
    side = Units(units.view, counts, cum, units.offset, units.history_len, units.name)
    return side, cum


def _unmasked(units: Units, side: Units, cum: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """Flat unit indices of ``units`` for flat indices ``flat`` drawn from ``side``."""
    e = np.searchsorted(cum, flat, side="right")
    before = np.where(e > 0, cum[np.maximum(e - 1, 0)], 0)
    base = np.where(e > 0, units.cum[np.maximum(e - 1, 0)], 0)
    return base + (flat - before)


def _joined(parts: list[tuple[np.ndarray, dict]]) -> Drawn:
    """One batch from the sides' draws, offline first; their extras joined key by key."""
    if len(parts) == 1:
        return parts[0]
    (a, ea), (b, eb) = parts
    if set(ea) != set(eb):
        raise TypeError(
            f"the sampler inside Mixed returned different extras for the two sides "
            f"({sorted(ea)} and {sorted(eb)})"
        )
    return np.concatenate([a, b]), {k: np.concatenate([ea[k], eb[k]]) for k in ea}
