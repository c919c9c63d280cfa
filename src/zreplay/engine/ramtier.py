"""The RAM tier: the most recent rows, decoded, in one preallocated ring per key.

Global row ``r`` lives in slot ``r % capacity``.  The tier holds rows ``[lo, hi)``; it is
also the writer's staging area, so a row is never overwritten before it is committed
(``make_room`` waits for the writer instead).  All bookkeeping is done by the owning engine
under its lock; this class only owns memory and copies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..schema import Schema


class RamTier:
    def __init__(self, schema: Schema, capacity_rows: int):
        self.schema = schema
        self.capacity = int(capacity_rows)
        self.rings: dict[str, np.ndarray] = {
            s.path: np.empty((self.capacity, *s.row_shape), s.dtype) for s in schema
        }
        self.lo = 0  # first row held
        self.hi = 0  # one past the last row written (published or not)

    @property
    def nbytes(self) -> int:
        return self.capacity * self.schema.row_bytes

    def _pieces(self, start: int, stop: int):
        """Slot slices covering rows [start, stop): one, or two when the ring wraps."""
        cap = self.capacity
        a, b = start % cap, (stop - 1) % cap + 1
        if stop - start <= 0:
            return []
        if a < b:
            return [(start, slice(a, b))]
        return [(start, slice(a, cap)), (start + cap - a, slice(0, b))]

    def write_trajectory(
        self, start: int, columns: Mapping[str, np.ndarray], T: int, B: int
    ) -> None:
        """Copy ``[T, B, ...]`` arrays into rows ``[start, start + T*B)`` in env-major order."""
        n = T * B
        for path, arr in columns.items():
            ring = self.rings[path]
            src = np.swapaxes(arr, 0, 1)  # [B, T, ...]: env-major
            pieces = self._pieces(start, start + n)
            if len(pieces) == 1:
                sl = pieces[0][1]
                np.copyto(ring[sl].reshape(B, T, *ring.shape[1:]), src)
            else:
                self.put_rows(path, start, np.ascontiguousarray(src).reshape(n, *ring.shape[1:]))

    def put_rows(self, key: str, start: int, rows: np.ndarray) -> None:
        """Copy flat rows (already env-major) into rows ``[start, start + len(rows))``."""
        ring = self.rings[key]
        for row0, sl in self._pieces(start, start + len(rows)):
            ring[sl] = rows[row0 - start : row0 - start + (sl.stop - sl.start)]

    def read_range(self, key: str, start: int, stop: int) -> list[tuple[int, np.ndarray]]:
        """Views of rows [start, stop) of ``key`` as (first_row, array) pieces."""
        ring = self.rings[key]
        return [(row0, ring[sl]) for row0, sl in self._pieces(start, stop)]

    def gather(self, key: str, rows: np.ndarray) -> np.ndarray:
        """Rows (all within ``[lo, hi)``) of ``key``; the engine inlines this on its hot path."""
        return self.rings[key][rows % self.capacity]

    def resized(self, capacity_rows: int) -> RamTier:
        """A larger tier holding the same rows [lo, hi)."""
        new = RamTier(self.schema, capacity_rows)
        new.lo = max(self.lo, self.hi - new.capacity)
        new.hi = self.hi
        for key in self.rings:
            for row0, piece in self.read_range(key, new.lo, self.hi):
                new.put_rows(key, row0, piece)
        return new


@dataclass
class RamPolicy:
    """How many recent rows the RAM tier keeps decoded.

    ``trajectories``: keep about this many of the newest trajectories (sized from the
    first one); ``max_bytes``: cap on the tier's size; ``enabled=False`` keeps only rows
    that are not yet committed, so every sample of committed data reads from disk.
    """

    enabled: bool = True
    trajectories: int | None = 5
    max_bytes: int | None = None

    def rows_for(self, schema: Schema, traj_rows: int) -> int:
        staging = 2 * traj_rows
        if not self.enabled:
            return staging
        rows = (self.trajectories or 0) * traj_rows
        if self.max_bytes is not None:
            budget = self.max_bytes // max(1, schema.row_bytes)
            rows = budget if not self.trajectories else min(rows, budget)
        return max(staging, rows)
