"""A sampler bound to one buffer: draws over the buffer's snapshots with the buffer's
random stream, and decides when a writer saves its priorities.

Priorities are saved as tree leaves beside the segment (``store/priority.py``, FORMAT.md)
with a commit: the writer asks :meth:`BoundSampler.priorities_to_save` for them while it
builds each commit, and writes them to the copy the current commit does not name before
publishing the commit that names it.  Saves happen when the leaves changed, at most every
``save_every_s`` seconds for background commits, and always for ``flush``/``close``/
``save_checkpoint``; a save whose commit failed is taken again.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..numbers import as_array, check_json
from ..samplers.contract import Context, Drawn, PrioritySampler, Sampler, Units


class BoundSampler:
    """``sampler`` drawing for one buffer: ``core`` claims a stateful sampler (one
    buffer per prioritized sampler); ``owner`` is what a hook receives as ``buffer``."""

    @staticmethod
    def check(sampler: Sampler) -> None:
        """Refuse a sampler a buffer could not use, before the buffer makes anything: a
        state JSON cannot hold (it is saved with every commit), priorities claimed without
        the :class:`PrioritySampler` contract, a prioritized sampler serving another
        live buffer."""
        check_json(sampler.state_dict(), f"{type(sampler).__name__}.state_dict()")
        if sampler.prioritized and not isinstance(sampler, PrioritySampler):
            raise TypeError(
                f"{type(sampler).__name__} sets prioritized = True; a sampler with priorities "
                "subclasses zreplay.samplers.base.PrioritySampler (what a buffer calls on it)"
            )
        if sampler.prioritized:
            sampler.check_unclaimed()

    def __init__(self, sampler: Sampler, core: Any, owner: Any):
        self.check(sampler)
        sampler.claim(core)
        self.sampler = sampler
        self.prio: PrioritySampler | None = sampler if sampler.prioritized else None
        # Weakly: the facade owns the core (which owns this), and must stay collectable
        # so that dropping it commits and releases its writer (BufferCore's drop finaliser).
        self._owner = weakref.ref(owner)
        self._last_save = -float("inf")

    @property
    def prioritized(self) -> bool:
        return self.sampler.prioritized

    def pick(self, rng, n: int, step: int, version=None) -> Callable[[Units, object], Drawn]:
        """A ``pick(units, snapshot)`` for the clip and n-step plans."""
        s, owner = self.sampler, self._owner

        def pick(units: Units, snap) -> Drawn:
            return s.draw_units(Context(rng, snap.space, step, owner(), version), units, n)

        return pick

    def admit(self, items: list, free_rows: int | None) -> list[bool]:
        """Which of ``items`` (in order) to add to a buffer with ``free_rows`` rows left
        before capacity (None: no capacity): an item that would fill the buffer is
        dropped when the sampler says so (``Staleness(evict_stale=True)``: a stale one)."""
        keep = []
        for it in items:
            full = free_rows is not None and it.n_rows > free_rows
            k = not (full and self.sampler.drops(it))
            keep.append(k)
            if free_rows is not None and k:
                free_rows = max(free_rows - it.n_rows, 0)
        return keep

    def admitted(self, items: list, keep: list[bool]) -> None:
        """An add of ``items`` went through, keeping those ``keep`` says."""
        for it, k in zip(items, keep, strict=True):
            self.sampler.admitted(it, k)

    # -- priorities -----------------------------------------------------------------

    def update_priorities(self, space, index, priorities) -> int:
        return self.sampler.update_priorities(space, as_array(index), as_array(priorities))

    def priorities(self, space, index) -> np.ndarray:
        return self.sampler.priorities(space, as_array(index))

    def priorities_to_save(self, space, n_rows: int, explicit: bool):
        """``(meta, leaves)`` to save with a commit of ``n_rows`` rows, or None: nothing
        changed, or a background commit within ``save_every_s`` of the last save."""
        s = self.prio
        if s is None:
            return None
        s.sync(space)
        now = time.monotonic()
        if not explicit and now - self._last_save < s.save_every_s:
            return None
        snap = s.snapshot(0, n_rows)
        if snap is None:
            return None
        self._last_save = now
        return snap

    def save_failed(self) -> None:
        """The commit carrying the last snapshot was not published: take it again."""
        if self.prio is not None:
            self.prio.mark_changed(0)

    # -- state ----------------------------------------------------------------------

    def state(self) -> dict:
        """JSON for a commit: ``{"sampler": sampler.state_dict()}``."""
        return {"sampler": self.sampler.state_dict()}

    def load_state(self, state: Mapping | None) -> None:
        """Restore the sampler's JSON state from a commit if it is of the same kind."""
        got = (state or {}).get("sampler")
        if got and got.get("kind") == type(self.sampler).__name__:
            self.sampler.load_state_dict(dict(got))

    def full_state(self, space) -> dict:
        """JSON state plus the priorities as arrays (``ReplayBuffer.state_dict``)."""
        out = self.state()
        if self.prio is not None:
            self.prio.sync(space)
            out["priorities"] = self.prio.priorities_state()
        return out

    def load_full_state(self, state: Mapping, space: Callable[[], Any]) -> None:
        self.load_state(state)
        if self.prio is not None and state.get("priorities") is not None:
            self.prio.load_priorities_state(state["priorities"], space())
