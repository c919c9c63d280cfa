"""A sampler bound to one writable engine: draws over its visible rows under its lock,
and saves the sampler's state, priorities included, with the engine's commits.

Priorities are saved as tree leaves in ``segments/<writer_id>/priority/<slot>`` (see
``store/priority.py`` and FORMAT.md): a commit carries ``sampler["priority"] = {"slot",
"seq", "low", "high", "capacity", "max_priority", "alpha", "eps"}`` naming the copy
that holds rows ``[low, high)``.  A save writes the other copy on the writer thread
before ``commit.json`` is replaced, so a crash leaves the previous copy named and intact.
Saves happen when the leaves changed, at most every ``save_every_s`` seconds for
background commits, and always for ``flush``/``close``/``save_checkpoint``.  Rows at or
past a commit's ``high`` (added after its save) reload at ``max_priority``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..store.priority import PriorityArrays
from .base import Context, Drawn, Persisted, RowSpace, Sampler, SegmentRows, Units, claim


class EngineSampler:
    """``sampler`` drawing over ``engine``'s rows (bind with :meth:`bind`)."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.engine = None
        self._epoch: object = None  # the engine's index the state belongs to
        self._published: dict | None = None  # priority copy named by the last commit
        self._inflight: dict | None = None  # saved with a commit not yet confirmed
        self._arrays: PriorityArrays | None = None
        self._last_save = -float("inf")

    def bind(self, engine) -> None:
        claim(self.sampler, engine)
        self.engine = engine

    # -- under the engine's lock ----------------------------------------------------

    def space(self) -> RowSpace:
        index = self.engine.index
        if index is not self._epoch:  # opened, cleared or replaced: rows start afresh
            self._epoch, self._arrays, self._inflight = index, None, None
            self._published = self._initial_copy()
        seg = SegmentRows(0, index, index.low_row, index.n_rows, index.low_row, self._persisted)
        return RowSpace.of_index(index, seg)

    def context(self, rng: np.random.Generator, step: int, buffer: Any) -> Context:
        return Context(rng, self.space(), step, buffer)

    def draw_rows(self, rng, n: int, step: int, buffer) -> Drawn:
        return self.sampler.draw_rows(self.context(rng, step, buffer), n)

    def pick(self, rng, n: int, step: int, buffer) -> Callable[[Units], Drawn]:
        """A ``pick(units)`` for :func:`zreplay.sampling.gather_clips` / ``gather_nstep``
        (called under the lock by the engine's gather)."""
        return lambda units: self.sampler.draw_units(self.context(rng, step, buffer), units, n)

    def _initial_copy(self) -> dict | None:
        """The priority copy the engine's current commit names, if it covers any row."""
        commit = self.engine.commit
        meta = commit.sampler.get("priority") if commit.sampler else None
        if not meta:
            return None
        if min(meta["high"], commit.n_rows) <= max(meta["low"], commit.low_row):
            return None  # e.g. the commit of a clear(): its rows are gone
        return dict(meta)

    def _persisted(self) -> Persisted | None:
        meta = self._published
        if meta is None:
            return None
        commit = self.engine.commit
        bounded = {**meta, "high": min(meta["high"], commit.n_rows)}
        return bounded, lambda lo, hi: self._store().read(meta["slot"], lo, hi)

    def _store(self) -> PriorityArrays:
        if self._arrays is None:
            eng = self.engine
            self._arrays = PriorityArrays(eng.seg_dir, writable=True, durable=eng.durable)
        return self._arrays

    def _confirm(self) -> None:
        if self._inflight is not None:
            if self.engine.commit.sampler.get("priority") == self._inflight:
                self._published, self._inflight = self._inflight, None

    def state(self) -> dict:
        """JSON for a commit: ``{"sampler": sampler.state_dict(), "priority": copy}``."""
        out = {"sampler": self.sampler.state_dict()}
        if self.sampler.prioritized and self.engine is not None:
            self.sampler.sync(self.space())
            self._confirm()
            if self._published is not None:
                out["priority"] = self._published
        return out

    def persist(self, n_rows: int, explicit: bool) -> tuple[dict, Callable[[], None] | None]:
        """The engine's commit hook: entries for the next commit's sampler state and a
        write to run before it is published (``None``: nothing to save now)."""
        s = self.sampler
        if not s.prioritized or self.engine is None:
            return {}, None
        s.sync(self.space())
        self._confirm()
        if self._inflight is not None:  # the commit carrying it failed: save again
            self._inflight = None
            s.mark_changed(0)
        now = time.monotonic()
        if not explicit and now - self._last_save < s.save_every_s:
            return {}, None
        snap = s.snapshot(0, n_rows)
        if snap is None:
            return {}, None
        meta, leaves = snap
        pub = self._published
        meta["slot"] = 1 - pub["slot"] if pub else 0
        meta["seq"] = pub["seq"] + 1 if pub else 1
        self._inflight, self._last_save = meta, now
        store, slot, low = self._store(), meta["slot"], meta["low"]
        return {"priority": meta}, lambda: store.write(slot, low, leaves)

    # -- the buffer's calls ---------------------------------------------------------

    def update_priorities(self, index, priorities) -> int:
        index, priorities = _as_numpy(index), _as_numpy(priorities)
        return self.engine.locked(
            lambda _i: self.sampler.update_priorities(self.space(), index, priorities)
        )

    def priorities(self, index) -> np.ndarray:
        index = _as_numpy(index)
        return self.engine.locked(lambda _i: self.sampler.priorities(self.space(), index))

    def load_state(self, state: Mapping | None) -> None:
        """Restore the sampler's JSON state from a commit if it is of the same kind."""
        got = (state or {}).get("sampler")
        if got and got.get("kind") == type(self.sampler).__name__:
            self.sampler.load_state_dict(dict(got))

    def full_state(self) -> dict:
        """JSON state plus the priorities as arrays (``ReplayBuffer.state_dict``)."""
        out = {"sampler": self.sampler.state_dict()}
        if self.sampler.prioritized:
            self.engine.locked(lambda _i: self.sampler.sync(self.space()))
            out["priorities"] = self.sampler.priorities_state()
        return out

    def load_full_state(self, state: Mapping) -> None:
        self.load_state(state)
        if self.sampler.prioritized and state.get("priorities") is not None:
            pri = state["priorities"]
            self.engine.locked(lambda _i: self.sampler.load_priorities_state(pri, self.space()))


class SamplerAccess:
    """The sampler methods of a facade over an engine (``self._sampling``, an
    :class:`EngineSampler`), shared by ``TrajectoryReplayBuffer`` and ``ReplayBuffer``."""

    def update_priorities(self, indices, priorities) -> int:
        """Set the priorities of what a batch drew (``batch["index"]``, int64: rows, or
        the start rows of clips / n-step transitions) to ``priorities`` (e.g. ``|TD
        error|``, one per index, or a scalar; numpy or torch).  Returns how many were
        applied: rows evicted since they were drawn are skipped.  ``ValueError`` for NaN,
        infinite or negative priorities; ``TypeError`` without a prioritized sampler."""
        return self._sampling.update_priorities(indices, priorities)

    def priorities(self, indices) -> np.ndarray:
        """Tree leaves ``(p + eps) ** alpha`` (float64) of rows ``indices`` (0 for rows
        evicted or not added yet)."""
        return self._sampling.priorities(indices)


def _as_numpy(x) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)
