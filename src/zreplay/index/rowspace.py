"""Visible rows as *positions*: what a sampler draws over.

Positions are ``[0, num_rows)``, oldest visible row first, in a writable buffer exactly
as in a view: a writer's one segment from position 0, a view's segments one after
another in name order.  Each segment's visible trajectories are contiguous there, oldest
first; its global rows convert through :mod:`zreplay.index.coords` only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .coords import GlobalRow, GlobalRows, Position, Positions, RowRange, positions_of, rows_at

# A segment's saved priorities: (metadata, read(lo, hi) -> float64 leaves of rows [lo, hi)).
Persisted = tuple[dict, Callable[[int, int], np.ndarray]]


@dataclass
class VisibleRows:
    """One writer's visible rows in a row space (``SegmentRows`` is its older name).

    ``key``: a number naming the segment for as long as the sampler lives (a writable
    buffer's is 0).  ``epoch``: an object that is replaced (compared by identity) when the
    segment's rows were renumbered from scratch (cleared, replaced by a checkpoint): state
    kept for the old rows is then dropped.  Global rows ``[low_row, n_rows)`` sit at
    positions ``[first, first + n_rows - low_row)``.  ``persisted()`` returns the
    priorities saved with the segment, if any; ``index`` is its trajectory table
    (:class:`~zreplay.index.trajectories.TrajectoryIndex`); ``sealed``: the segment is an
    immutable offline part (what ``samplers.Mixed`` draws its offline fraction from).
    """

    key: int
    epoch: object
    low_row: GlobalRow
    n_rows: GlobalRow
    first: Position
    persisted: Callable[[], Persisted | None] | None = None
    # The segment's in-RAM trajectory table (offsets, model_weights_id, ...), if known.
    index: object = None
    sealed: bool = False

    @property
    def rows(self) -> RowRange:
        """Its visible global rows."""
        return RowRange(self.low_row, self.n_rows)

    @property
    def pos0(self) -> Position:
        """The position of its first row (``first``, by the name older samplers use)."""
        return self.first

    def positions(self, rows: GlobalRows) -> Positions:
        """Positions of its global ``rows`` (int64, any shape)."""
        return positions_of(rows, self.low_row, self.first)

    def rows_at(self, positions: Positions) -> GlobalRows:
        """Global rows at its ``positions`` (int64, any shape)."""
        return rows_at(positions, self.low_row, self.first)


SegmentRows = VisibleRows  # its name until issue 34; samplers written against it keep working


class RowSpace:
    """Visible trajectories as row positions: trajectory ``g`` holds positions
    ``[offsets[g], offsets[g + 1])`` (``offsets``: int64[G + 1] positions); segment ``s``
    holds trajectories ``[bounds[s], bounds[s + 1])`` (``bounds`` int64[S + 1]), oldest first;
    ``read`` gathers stored rows at positions.

    ``offsets`` may be given as the global rows of one segment whose row ``origin`` is
    position 0 (:meth:`of_index`): they become positions on first use of
    :attr:`offsets`, so a draw that needs only the range or a few trajectories
    (:meth:`starts`) never converts the whole table."""

    __slots__ = ("_stored", "_origin", "_offsets", "bounds", "segments", "read", "lo", "hi")

    def __init__(
        self,
        offsets: np.ndarray,
        bounds: np.ndarray,
        segments: list[VisibleRows] | None = None,
        read: Callable[[str, Positions], np.ndarray] | None = None,
        origin: GlobalRow = 0,
    ):
        self._stored, self._origin = offsets, int(origin)
        self._offsets = offsets if not self._origin else None
        # The range, as plain ints: a uniform draw reads only these.
        self.lo: Position = int(offsets[0]) - self._origin if len(offsets) else 0
        self.hi: Position = int(offsets[-1]) - self._origin if len(offsets) else 0
        self.bounds = bounds
        self.segments: list[VisibleRows] = [] if segments is None else segments
        # read(key, positions) -> the stored rows of ``key`` at ``positions`` (the
        # engine's gather, for samplers that weigh rows by a stored column: Staleness).
        self.read = read

    @classmethod
    def of_index(cls, index, segment: VisibleRows, read=None) -> RowSpace:
        """The space of one writer's in-RAM index, its oldest visible row at position 0
        (``segment.first`` must be 0)."""
        off = index.offsets[index.low :]
        bounds = np.array([0, len(off) - 1], np.int64)
        return cls(off, bounds, [segment], read, origin=segment.low_row)

    @property
    def offsets(self) -> Positions:
        if self._offsets is None:
            self._offsets = positions_of(self._stored, self._origin, 0)
        return self._offsets

    def starts(self, g) -> Positions:
        """Position of the first row of trajectories ``g`` (int64, any shape; ``g`` up to
        ``G``: ``starts(G)`` is ``hi``), without converting the whole table."""
        return positions_of(self._stored[g], self._origin, 0)

    @property
    def num_rows(self) -> int:
        return self.hi - self.lo

    def trajectory_of(self, positions: Positions) -> np.ndarray:
        """Trajectory ordinal ``g`` holding each position."""
        rows = rows_at(positions, self._origin, 0)
        return np.searchsorted(self._stored, rows, side="right") - 1

    def age(self, g: np.ndarray) -> np.ndarray:
        """Trajectories its writer added after trajectory ``g`` (0 = its newest)."""
        seg = np.searchsorted(self.bounds, g, side="right") - 1
        return self.bounds[seg + 1] - 1 - g

    def tails(self, n: int) -> list[tuple[int, int]]:
        """Trajectory ordinal ranges ``[g0, g1)`` of the newest ``n`` of each segment."""
        b = self.bounds
        return [(max(int(b[s]), int(b[s + 1]) - n), int(b[s + 1])) for s in range(len(b) - 1)]
