"""What the buffer core reads through: the one protocol the writer and the reader share.

:class:`~zreplay.engine.writer.SegmentWriter` (one writer's segment, its live state) and
:class:`~zreplay.engine.reader.BufferReader` (every segment as of the last refresh) both
implement :class:`Engine`, so the core's read side (sampling, gathers, clips, n-step,
episodes, rows) is written once over either.  What only a writer does (add, flush,
clear, checkpoint, replace) is the writer's own API, used by the writable core alone.

Positions: what a draw hands :meth:`Engine.read` are positions of the engine's snapshot,
``[0, num_rows)`` over its visible rows, oldest first, for a writer (its one segment) as
for a reader (every segment in name order); see :mod:`zreplay.index.coords`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ..index.episodes import EpisodeView
from ..schema import Schema
from .gather import Alloc, Snapshot


@runtime_checkable
class Engine(Protocol):
    """A buffer's rows as the core reads them (see the module docstring)."""

    path: Any  # the buffer's location (zreplay.store.location)

    @property
    def schema(self) -> Schema | None:
        """The stored keys, dtypes and row shapes (None before the first add)."""

    @property
    def num_rows(self) -> int:
        """Visible rows."""

    @property
    def num_trajectories(self) -> int:
        """Visible trajectories."""

    @property
    def next_trajectory_id(self) -> int:
        """The id the next trajectory added gets (a reader: the largest of its writers')."""

    @property
    def closed(self) -> bool: ...

    def snapshot(self) -> Snapshot:
        """The visible rows now (a writer: with its lock held, see ``locked``)."""

    def locked(self, fn: Callable[[Snapshot], object]) -> object:
        """``fn(snapshot)`` with nothing added or evicted while it runs."""

    def read(
        self, draw: Callable[[Snapshot], object], alloc: Alloc | None = None, redraw: bool = True
    ) -> tuple[object, dict]:
        """``draw(snapshot)`` at one consistent instant, then gather what it asks for
        (positions, or requests ``{name: (key, positions)}``); ``(drawn, {name: array})``.
        ``redraw=False``: positions the caller chose, never drawn again on another
        snapshot."""

    def episodes(self) -> EpisodeView:
        """The visible episodes (rows as positions)."""

    def refresh(self) -> bool:
        """Pick up what writers committed since (True if anything new became visible);
        a writer reads its live state: always False."""

    def stale(self) -> bool:
        """Has anything been committed since the last refresh (a writer: never)?"""

    def empty_message(self) -> str:
        """What sampling an empty buffer says."""

    def close(self) -> None:
        """Release what the engine holds (a writer: commit, stop, unlock)."""
