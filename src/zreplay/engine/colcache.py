"""Small columns decoded in RAM: the newest committed rows of every key whose rows are at
most :data:`SMALL_ROW_BYTES`, up to a byte budget.

Clips, n-step windows and frame stacks read a few rows of every key; for flags, rewards,
actions and state vectors each of those reads costs a batched disk read (a TensorStore
call, chunk lookups, decoding an inner chunk of up to 1024 rows for the few rows wanted)
that is far more than the bytes it returns.  A segment's :class:`ColumnCache` holds those
columns decoded for rows ``[lo, hi)`` (the newest committed rows that fit the budget), so
such reads are one numpy fancy index; images and other large rows are still read from
disk.

The cache follows the commit, not the add path: :meth:`ColumnCache.cover` extends it
with one range read per key of the rows committed since it last looked (committed rows
never change, so cached rows stay valid as long as they are visible) and forgets rows
below the visible range.  It is filled only when a read needs it (the first read of a
cached key below the writer's RAM tier, or any read of a view), so a buffer that never
reads old small rows pays nothing.

Budget: ``column_cache_bytes`` (default :data:`DEFAULT_BUDGET`, 128 MiB) per segment
reader, ``zreplay.open(path, column_cache_bytes=...)`` for views and
``RamPolicy(column_cache_bytes=...)`` for writers (off with the RAM tier); 0 turns it off.
"""

from __future__ import annotations

import threading

import numpy as np

from ..schema import Schema

# Keys with rows up to this size are cached: flags, rewards, actions, state vectors
# (RLinf's actions f32[28] are 112 B, a SAC observation f32[64] 256 B; a 64x64x3 frame
# is 12 KiB and is not).
SMALL_ROW_BYTES = 1024
DEFAULT_BUDGET = 128 << 20
# Rows are read in pieces of at most this many bytes (all keys together), so filling a
# large cache never holds a second copy of it.
_FILL_BYTES = 32 << 20


def small_keys(schema: Schema) -> list[str]:
    """The keys a column cache holds for ``schema``."""
    return [s.path for s in schema if s.row_bytes <= SMALL_ROW_BYTES]


class ColumnCache:
    """Rows ``[lo, hi)`` of a segment's small keys, decoded, in one ring per key.

    Global row ``r`` lives in slot ``r % capacity``; the capacity grows (doubling) up
    to ``max_rows`` = the budget over the cached keys' row bytes.  Not thread-safe: its
    owner calls it under the lock that guards its snapshot (a writer's condition; a
    view is used from one thread at a time).
    """

    def __init__(self, schema: Schema, budget_bytes: int):
        self.keys = small_keys(schema) if budget_bytes > 0 else []
        self._specs = {k: schema.specs[k] for k in self.keys}
        row_bytes = sum(s.row_bytes for s in self._specs.values())
        self.max_rows = int(budget_bytes // row_bytes) if self.keys and row_bytes else 0
        if not self.max_rows:
            self.keys = []
        self._key_set = frozenset(self.keys)
        self._rings: dict[str, np.ndarray] = {}
        self.capacity = 0
        self.lo = self.hi = 0
        self.last_read: int | None = None  # first row the last cover() read, if any
        self.lock = threading.Lock()

    def holds(self, key: str) -> bool:
        return key in self._key_set

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self._rings.values())

    def cover(self, read_range, low_row: int, hi: int) -> int:
        """Hold the newest rows of ``[low_row, hi)`` that fit (reading what is missing
        with ``read_range(key, start, stop) -> future`` with ``.result()``); returns the
        first row held (rows ``[lo, hi)`` are then in RAM).  Nothing is kept from a read
        that fails."""
        self.last_read = None
        want_lo = max(int(low_row), int(hi) - self.max_rows)
        if hi <= want_lo:
            return hi
        if want_lo >= self.hi or self.hi <= self.lo or hi < self.hi:
            start = want_lo  # nothing held overlaps (or the rows were renumbered): afresh
            self.lo = self.hi = want_lo
        else:
            start = self.hi
            self.lo = max(self.lo, want_lo)
        if start < hi:
            self.last_read = start
            self._ensure_capacity(hi - self.lo)
            step = max(1, _FILL_BYTES // max(1, sum(s.row_bytes for s in self._specs.values())))
            for a in range(start, hi, step):
                b = min(hi, a + step)
                futs = {k: read_range(k, a, b) for k in self.keys}
                got = {k: f.result() for k, f in futs.items()}
                for k, rows in got.items():
                    self._put(k, a, rows)
                self.hi = b
        return self.lo

    def reset(self) -> None:
        """Forget every row (what was read may be fill values of deleted shards)."""
        self.lo = self.hi = 0

    def gather(self, key: str, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows (all within ``[lo, hi)``) of ``key``: one fancy index."""
        return np.take(self._rings[key], rows % self.capacity, axis=0, out=out, mode="clip")

    def _put(self, key: str, start: int, rows: np.ndarray) -> None:
        ring, cap = self._rings[key], self.capacity
        n, a = len(rows), start % cap
        first = min(n, cap - a)
        ring[a : a + first] = rows[:first]
        if first < n:
            ring[: n - first] = rows[first:]

    def _ensure_capacity(self, rows: int) -> None:
        if rows <= self.capacity:
            return
        cap = min(self.max_rows, max(rows, 2 * self.capacity, 1024))
        old, old_cap = self._rings, self.capacity
        self._rings = {k: np.empty((cap, *s.row_shape), s.dtype) for k, s in self._specs.items()}
        self.capacity = cap
        if old_cap and self.hi > self.lo:
            for k, ring in old.items():
                idx = np.arange(self.lo, self.hi) % old_cap
                self._put(k, self.lo, ring[idx])
