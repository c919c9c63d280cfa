"""What every facade shares, declared once: its core, its lifecycle, and the reads whose
meaning is the same in all of them.

:class:`Facade` is the base of :class:`~zreplay.api.view.BufferView`,
:class:`~zreplay.TrajectoryReplayBuffer` and :class:`~zreplay.ReplayBuffer`; each of them
keeps only its own ecosystem's names and conversions (nested numpy dicts for a view,
tensors for RLinf, stable-worldmodel's names).  :class:`WritableFacade` adds what both
writable facades mean alike.  Every facade makes its core with ``owner=self``, so that
dropping it closes the core (the drop finaliser ``BufferCore`` registers on its owner), and
crosses a process boundary through ``core.handoff``.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from ..core import BufferCore


class Of:
    """A facade attribute that is an attribute of an object the facade holds, declared
    by where it lives instead of written as a method that forwards to it:
    ``num_rows = Of("core.engine")`` (``name`` renames: ``total_samples =
    Of("core.engine", "num_rows")``).  Read on a facade, a property comes back as its
    value now and a method bound to the object that does the work, so the facade adds no
    frame; read on the class, it is this declaration (``where``, ``name``, ``__doc__``)."""

    def __init__(self, where: str, name: str | None = None, doc: str | None = None):
        self.where, self.name, self.__doc__ = where, name, doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name
        self._get = attrgetter(f"{self.where}.{self.name}")

    def __get__(self, facade: Any, owner: type | None = None) -> Any:
        return self if facade is None else self._get(facade)

    def __repr__(self) -> str:
        return f"Of({self.where!r}, {self.name!r})"


class Facade:
    """A facade's core (``self.core``), lifecycle and shared reads."""

    core: BufferCore

    closed = Of(
        "core", doc="Whether close() was called (a view is never closed: it holds no lock)."
    )
    close = Of(
        "core",
        doc="Release what the buffer holds (idempotent): a writer commits everything "
        "added, saves the sampler state and releases its writer lock; a rate-limited "
        "learner publishes its last count and that it stopped, so writers stop waiting "
        "for it.",
    )

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc) -> None:
        """Close, as a file does."""
        self.close()

    refresh = Of(
        "core",
        doc="Pick up what writers committed since; True if anything new became visible "
        "(a writable buffer reads its own live state: always False).",
    )
    schema = Of(
        "core.engine",
        doc="The stored keys with their dtypes and row shapes (None before the first add).",
    )
    sampler = Of("core", doc="The sampler (zreplay.samplers) the sampling methods draw with.")
    num_episodes = Of("core", doc="Episodes (whole or partly) in the visible data.")
    episode_table = Of(
        "core",
        doc="Per-episode columns (episode id, length, first_step, terminated, truncated), "
        "oldest first.",
    )
    update_priorities = Of(
        "core",
        doc="Set the priorities of what a batch drew (batch['index'], int64: rows, or the "
        "start rows of clips / n-step transitions) to priorities (e.g. |TD error|, one "
        "per index, or a scalar; numpy or torch).  Returns how many were applied: rows "
        "evicted since they were drawn are skipped.  ValueError for NaN, infinite or "
        "negative priorities; TypeError without a prioritized sampler.  A view keeps "
        "them in this process only (the store is never written).",
    )
    priorities = Of(
        "core",
        doc="Tree leaves (p + eps) ** alpha (float64) of rows indices (0 for rows evicted "
        "or not added yet).",
    )


class WritableFacade(Facade):
    """What the writable facades (RLinf's and stable-worldmodel's) mean alike."""

    flush = Of(
        "core",
        doc="Block until everything added is committed to the store (with the sampler state).",
    )
    clear = Of(
        "core.engine",
        doc="Remove every trajectory / episode, on disk too, in one commit; the schema "
        "stays, and trajectory ids, the step counter and the random stream go on "
        "(nothing is reused).",
    )
