"""Row coordinates: what each row number means, named once.

A buffer is one segment per writer; a writer appends ``[T, B]`` trajectories as ``B``
env-major lanes of ``T`` rows.  Between the layers a row travels as one of these numbers:

* :data:`GlobalRow`: the ``n``-th row a segment's writer ever appended.  Never reused:
  eviction, a clear and a replace only raise the segment's first visible row
  (``low_row``); a commit's ``n_rows`` is one past its last.  The store's arrays, a
  commit, the RAM tier, the column cache and a prioritized tree are indexed by it.
* :data:`Position`: a row of a snapshot's visible rows, ``[0, num_rows)`` oldest
  first, in a writer exactly as in a view: what a sampler draws, what a hook returns,
  what ``BufferCore.rows`` takes and the gather reads.  Each segment's visible rows are
  contiguous there: a writable buffer's one segment from position 0, a view's segments
  one after another in name order.  So once rows are evicted (or, in a view, a refresh
  grows an earlier segment) a position names another row; a global row does not.
* :data:`TierSlot`: a slot of the RAM tier's ring (``row % capacity``).
* :data:`CacheSlot`: a slot of a column cache's ring (``row % slots``).
* :data:`UnitIndex`: a flat index into a sampler's units (clips, n-step transitions,
  episodes: :class:`~zreplay.samplers.contract.Units`).
* :data:`TaggedRow`: a prioritized batch's ``index``: a global row, plus the segment's
  key (views) and the tag of the contents it was drawn from (after a replace) in the
  high bits (:func:`tag_rows`, :func:`untag_rows`).

Arrays of them stay plain int64 numpy arrays; the array names below are annotations
only (no per-row objects, no conversion on the sampling path).  Ranges are small frozen
values (:class:`RowRange`), like zarr's ``RangeByteRequest(start, end)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType, TypeAlias

import numpy as np

GlobalRow = NewType("GlobalRow", int)
Position = NewType("Position", int)
TierSlot = NewType("TierSlot", int)
CacheSlot = NewType("CacheSlot", int)
UnitIndex = NewType("UnitIndex", int)
TaggedRow = NewType("TaggedRow", int)

# int64 arrays of the coordinate named (any shape).
GlobalRows: TypeAlias = np.ndarray
Positions: TypeAlias = np.ndarray
TierSlots: TypeAlias = np.ndarray
CacheSlots: TypeAlias = np.ndarray
UnitIndices: TypeAlias = np.ndarray
TaggedRows: TypeAlias = np.ndarray

# A tagged row's bits: row (0-39), segment key (40-55), contents tag (56-62).
SEGMENT_SHIFT = 40
CONTENTS_SHIFT = 56
ROW_MASK = (1 << SEGMENT_SHIFT) - 1
SEGMENT_MASK = (1 << (CONTENTS_SHIFT - SEGMENT_SHIFT)) - 1


@dataclass(frozen=True, slots=True)
class RowRange:
    """Global rows ``[start, stop)`` of one segment (``stop >= start``)."""

    start: GlobalRow
    stop: GlobalRow

    def __len__(self) -> int:
        return self.stop - self.start

    def arange(self) -> GlobalRows:
        """The rows, int64[len(self)]."""
        return np.arange(self.start, self.stop, dtype=np.int64)


def positions_of(rows, start: GlobalRow, first: Position):
    """Positions of global ``rows`` (an int or an int64 array) of a segment whose row
    ``start`` sits at position ``first``."""
    return rows + (first - start)


def rows_at(positions, start: GlobalRow, first: Position):
    """Inverse of :func:`positions_of`: the global rows at ``positions`` (the same
    array where they coincide: a segment that never evicted, at position 0)."""
    if first == start:
        return positions
    return positions + (start - first)


def tag_rows(rows: GlobalRows, key: int, tag: int = 0) -> TaggedRows:
    """A prioritized batch's ``index`` for global ``rows`` (int64[n]) drawn from segment
    ``key`` in its contents ``tag`` (the rows themselves for key 0, tag 0)."""
    high = (int(key) << SEGMENT_SHIFT) | (int(tag) << CONTENTS_SHIFT)
    return rows if high == 0 else rows + high


def untag_rows(index: TaggedRows) -> tuple[np.ndarray, np.ndarray, GlobalRows]:
    """``(segment keys, contents tags, global rows)`` of a batch's ``index`` (int64[n])."""
    return (index >> SEGMENT_SHIFT) & SEGMENT_MASK, index >> CONTENTS_SHIFT, index & ROW_MASK
