"""Visible rows as *positions*: what a sampler draws over.

A writable buffer's positions are its global row ids (``[low_row, n_rows)``); a view's
are ``[0, num_rows)`` over its segments in name order.  Each segment's visible
trajectories are contiguous there, oldest first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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
    (:class:`~zreplay.index.trajectories.TrajectoryIndex`).
    """

    key: int
    epoch: object
    low_row: GlobalRow
    n_rows: GlobalRow
    first: Position
    persisted: Callable[[], Persisted | None] | None = None
    # The segment's in-RAM trajectory table (offsets, model_weights_id, ...), if known.
    index: object = None

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


@dataclass
class RowSpace:
    """Visible trajectories as row positions: trajectory ``g`` holds positions
    ``[offsets[g], offsets[g + 1])`` (``offsets``: int64[G + 1] positions); segment ``s``
    holds trajectories ``[bounds[s], bounds[s + 1])`` (``bounds`` int64[S + 1]), oldest first;
    ``read`` gathers stored rows at positions."""

    offsets: Positions
    bounds: np.ndarray
    segments: list[VisibleRows] = field(default_factory=list)
    # read(key, positions) -> the stored rows of ``key`` at ``positions`` (the engine's
    # gather, for samplers that weigh rows by a stored column: Staleness).
    read: Callable[[str, Positions], np.ndarray] | None = None

    @classmethod
    def of_index(cls, index, segment: VisibleRows, read=None) -> RowSpace:
        """The space of one writer's in-RAM index (positions are global rows)."""
        off = index.offsets[index.low :]
        return cls(off, np.array([0, len(off) - 1], np.int64), [segment], read)

    @property
    def lo(self) -> Position:
        return int(self.offsets[0])

    @property
    def hi(self) -> Position:
        return int(self.offsets[-1])

    @property
    def num_rows(self) -> int:
        return self.hi - self.lo

    def trajectory_of(self, positions: Positions) -> np.ndarray:
        """Trajectory ordinal ``g`` holding each position."""
        return np.searchsorted(self.offsets, positions, side="right") - 1

    def age(self, g: np.ndarray) -> np.ndarray:
        """Trajectories its writer added after trajectory ``g`` (0 = its newest)."""
        seg = np.searchsorted(self.bounds, g, side="right") - 1
        return self.bounds[seg + 1] - 1 - g

    def tails(self, n: int) -> list[tuple[int, int]]:
        """Trajectory ordinal ranges ``[g0, g1)`` of the newest ``n`` of each segment."""
        b = self.bounds
        return [(max(int(b[s]), int(b[s + 1]) - n), int(b[s + 1])) for s in range(len(b) - 1)]
