"""What every facade shares, declared once: its core, its lifecycle, and the reads whose
meaning is the same in all of them.

:class:`Facade` is the base of :class:`~zreplay.api.view.BufferView`,
:class:`~zreplay.TrajectoryReplayBuffer` and :class:`~zreplay.ReplayBuffer`; each of them
keeps only its own ecosystem's names and conversions (nested numpy dicts for a view,
tensors for RLinf, stable-worldmodel's names).  :class:`WritableFacade` adds what both
writable facades mean alike.  Every facade makes its core with ``owner=self``, so that
dropping it closes the core (the drop finaliser, ``BufferCore.close_when_dropped``), and
crosses a process boundary through ``core.handoff``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import BufferCore
from ..samplers import Sampler


class Facade:
    """A facade's core (``self.core``), lifecycle and shared reads."""

    core: BufferCore

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a view is never closed: it holds no lock)."""
        return self.core.closed

    def close(self) -> None:
        """Release what the buffer holds (idempotent): a writer commits everything
        added, saves the sampler state and releases its writer lock; a rate-limited
        learner publishes its last count and that it stopped, so writers stop waiting
        for it."""
        self.core.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc) -> None:
        """Close, as a file does."""
        self.close()

    def refresh(self) -> bool:
        """Pick up what writers committed since; True if anything new became visible
        (a writable buffer reads its own live state: always False)."""
        return self.core.refresh()

    @property
    def schema(self):
        """The stored keys with their dtypes and row shapes (None before the first add)."""
        return self.core.schema

    @property
    def sampler(self) -> Sampler:
        """The sampler (``zreplay.samplers``) that the sampling methods draw with."""
        return self.core.sampler

    @property
    def num_episodes(self) -> int:
        """Episodes (whole or partly) in the visible data."""
        return self.core.num_episodes

    def episode_table(self) -> dict[str, np.ndarray]:
        """Per-episode columns (``episode`` id, ``length``, ``first_step``,
        ``terminated``, ``truncated``), oldest first."""
        return self.core.episode_table()

    def update_priorities(self, indices, priorities) -> int:
        """Set the priorities of what a batch drew (``batch["index"]``, int64: rows, or
        the start rows of clips / n-step transitions) to ``priorities`` (e.g. ``|TD
        error|``, one per index, or a scalar; numpy or torch).  Returns how many were
        applied: rows evicted since they were drawn are skipped.  ``ValueError`` for
        NaN, infinite or negative priorities; ``TypeError`` without a prioritized
        sampler.  A view keeps them in this process only (the store is never written)."""
        return self.core.update_priorities(indices, priorities)

    def priorities(self, indices) -> np.ndarray:
        """Tree leaves ``(p + eps) ** alpha`` (float64) of rows ``indices`` (0 for rows
        evicted or not added yet)."""
        return self.core.priorities(indices)


class WritableFacade(Facade):
    """What the writable facades (RLinf's and stable-worldmodel's) mean alike."""

    def flush(self) -> None:
        """Block until everything added is committed to the store (with the sampler
        state)."""
        self.core.flush()

    def clear(self) -> None:
        """Remove every trajectory / episode, on disk too, in one commit; the schema
        stays, and trajectory ids, the step counter and the random stream go on
        (nothing is reused)."""
        self.core.clear()
