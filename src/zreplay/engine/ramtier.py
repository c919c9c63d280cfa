"""The RAM tier: the most recent rows, decoded, in one preallocated ring per key.

Global row ``r`` lives in slot ``r % capacity``.  The tier holds rows ``[lo, hi)``: the
newest ``window`` rows (the RAM tier proper: what committed data is read from RAM) and
every row not yet committed.  The ring is also the writer's staging area, so a row is
never overwritten before it is committed or evicted (the writer waits for its committer
before reserving rows that would overwrite uncommitted ones; the committer never writes
a row evicted before its commit from its slot, which may be reused); ``capacity - window`` slots are
room for rows staged beyond the window while the committer catches up.

Invariants: ``hi - lo <= capacity``; rows below ``hi - window`` are held only while
uncommitted (:meth:`release_committed`); ``lo`` and ``hi`` only grow, except that
:meth:`unreserve` takes back the rows of an add that failed and :meth:`put_below` adds
committed rows read back from disk just below ``lo`` (a reopened writer refilling the
tier).  They change only through this class's methods, which the owning writer calls
under its lock.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..index.coords import GlobalRow, GlobalRows, TierSlots
from ..numbers import as_int
from ..schema import Schema

# Rows up to this size are moved as single opaque elements during the env-major
# transpose: numpy's strided copy is ~1.5-5x faster per row that way (measured on
# float32[8] and float32[64] rows); larger rows gain nothing.
_OPAQUE_ROW_BYTES = 1024


def _transpose_into(dst: np.ndarray, src: np.ndarray, T: int, B: int) -> None:
    """Copy ``src [T, B, *row]`` into the contiguous rows ``dst [B*T, *row]`` env-major.

    Iterates in the source's order (sequential reads, strided writes), which measured
    faster than the reverse for every row size tried.
    """
    row_bytes = dst.itemsize * int(np.prod(dst.shape[1:], dtype=np.int64))
    if 0 < row_bytes <= _OPAQUE_ROW_BYTES and src.flags.c_contiguous and dst.flags.c_contiguous:
        opaque = np.dtype((np.void, row_bytes))
        d = dst.reshape(T * B, -1).view(opaque).reshape(B, T)
        s = src.reshape(T, -1).view(opaque).reshape(T, B)
        np.copyto(d.T, s)
    else:
        np.copyto(np.swapaxes(dst.reshape(B, T, *dst.shape[1:]), 0, 1), src)


class RamTier:
    def __init__(self, schema: Schema, capacity_rows: int, window_rows: int | None = None):
        self.schema = schema
        self.capacity = int(capacity_rows)
        # Rows kept once committed (the tier proper); the other slots only stage rows.
        self.window = self.capacity if window_rows is None else min(int(window_rows), self.capacity)
        self.rings: dict[str, np.ndarray] = {
            s.path: np.empty((self.capacity, *s.row_shape), s.dtype) for s in schema
        }
        self._lo = 0  # first row held
        self._hi = 0  # one past the last row reserved (published or not)

    @property
    def lo(self) -> GlobalRow:
        """First row held."""
        return self._lo

    @property
    def hi(self) -> GlobalRow:
        """One past the last row reserved (written or being written)."""
        return self._hi

    @property
    def nbytes(self) -> int:
        return self.capacity * self.schema.row_bytes

    def reset(self, row: GlobalRow) -> None:
        """Hold no rows; the next reservation starts at ``row``."""
        self._lo = self._hi = int(row)

    def reserve(self, k: int, committed: GlobalRow = 0) -> GlobalRow:
        """Reserve rows ``[hi, hi + k)`` for an add (dropping the oldest rows the ring
        reuses, and committed rows ``< committed`` that fall out of the window);
        returns the first."""
        start = self._hi
        self._hi = start + int(k)
        self._lo = max(self._lo, self._hi - self.capacity)
        self.release_committed(committed)
        return start

    def release_committed(self, committed: GlobalRow) -> None:
        """Rows below ``committed`` are on disk: keep only those inside the window."""
        self.release_below(min(int(committed), self._hi - self.window))

    def unreserve(self, start: GlobalRow) -> None:
        """Take back the reservation that began at ``start`` (its add failed).  Rows the
        reservation pushed out of the ring stay out (their slots may be overwritten)."""
        self._hi = int(start)
        self._lo = min(self._lo, self._hi)

    def room_below(self) -> GlobalRow:
        """First row :meth:`put_below` could still take (the window's first row)."""
        return self._hi - self.window

    def put_below(self, start: GlobalRow, rows: Mapping[str, np.ndarray]) -> None:
        """Hold committed rows ``[start, lo)`` too (``rows``: every key's, env-major);
        ``start >= room_below()``."""
        stop = self._lo
        if start < self.room_below() or any(len(r) != stop - start for r in rows.values()):
            raise ValueError(f"rows [{start}, {stop}) do not fit below the tier")
        for key, r in rows.items():
            self.put_rows(key, start, r)
        self._lo = int(start)

    def release_below(self, row: GlobalRow) -> None:
        """Stop holding rows below ``row`` (evicted, or committed with the RAM tier off)."""
        self._lo = min(max(self._lo, int(row)), self._hi)

    def _pieces(self, start: GlobalRow, stop: GlobalRow) -> list[tuple[GlobalRow, slice]]:
        """``(first row, slot slice)`` pieces covering rows [start, stop): one, or two
        when the ring wraps (row ``r`` is in slot ``r % capacity``)."""
        cap = self.capacity
        a, b = start % cap, (stop - 1) % cap + 1
        if stop - start <= 0:
            return []
        if a < b:
            return [(start, slice(a, b))]
        return [(start, slice(a, cap)), (start + cap - a, slice(0, b))]

    def write_trajectory(
        self, start: GlobalRow, columns: Mapping[str, np.ndarray], T: int, B: int
    ) -> None:
        """Copy ``[T, B, ...]`` arrays into rows ``[start, start + T*B)`` in env-major order."""
        n = T * B
        for path, arr in columns.items():
            ring = self.rings[path]
            pieces = self._pieces(start, start + n)
            if len(pieces) == 1:
                _transpose_into(ring[pieces[0][1]], arr, T, B)
            else:
                flat = np.swapaxes(arr, 0, 1).reshape(n, *ring.shape[1:])  # copies: rare path
                self.put_rows(path, start, flat)

    def put_rows(self, key: str, start: GlobalRow, rows: np.ndarray) -> None:
        """Copy flat rows (already env-major) into rows ``[start, start + len(rows))``."""
        ring = self.rings[key]
        for row0, sl in self._pieces(start, start + len(rows)):
            ring[sl] = rows[row0 - start : row0 - start + (sl.stop - sl.start)]

    def read_range(
        self, key: str, start: GlobalRow, stop: GlobalRow
    ) -> list[tuple[GlobalRow, np.ndarray]]:
        """Views of rows [start, stop) of ``key`` as (first row, array) pieces."""
        ring = self.rings[key]
        return [(row0, ring[sl]) for row0, sl in self._pieces(start, stop)]

    def slots(self, rows: GlobalRows, below: GlobalRow | None = None) -> TierSlots:
        """Ring slots of global rows (all within ``[lo, hi)``, and below ``below`` if
        given: rows below the capacity are their own slots, no arithmetic)."""
        if below is not None and below <= self.capacity:
            return rows
        return rows % self.capacity

    def gather(self, key: str, slots: TierSlots, out: np.ndarray | None = None) -> np.ndarray:
        """Rows at ``slots`` of ``key``, written into ``out`` if given (one fancy index)."""
        # mode="clip": slots are in range by construction, and the default "raise" makes
        # numpy buffer the result and copy it twice (measured 3x slower on image rows).
        return self.rings[key].take(slots, axis=0, out=out, mode="clip")

    def resized(self, capacity_rows: int, window_rows: int | None = None) -> RamTier:
        """A larger tier (window ``window_rows``, default: this one's) holding the same
        rows [lo, hi), or the newest ``capacity_rows`` of them."""
        window = self.window if window_rows is None else window_rows
        new = RamTier(self.schema, capacity_rows, window)
        new._lo = max(self._lo, self._hi - new.capacity)
        new._hi = self._hi
        for key in self.rings:
            for row0, piece in self.read_range(key, new.lo, self.hi):
                new.put_rows(key, row0, piece)
        return new


def default_staging_bytes() -> int:
    """RAM for rows staged beyond the RAM tier: 256 MiB (26 of RLinf's 9.8 MB image
    trajectories), at most 1/16 of physical memory.  The ring grows to it only when the
    committer falls behind.  Measured (benchmarks/HISTORY.md, "Add path"): a 1 GiB budget
    made adds slower on a shared machine, its fresh pages stalling in the kernel's
    huge-page compaction."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        ram = 4 << 30
    return int(min(256 << 20, ram // 16))


@dataclass
class RamPolicy:
    """How many recent rows the RAM tier keeps decoded.

    ``trajectories``: keep about this many of the newest trajectories (sized from the
    first one); ``max_bytes``: cap on the committed rows kept (``ram_budget_bytes``: rows
    added but not yet committed take up to ``staging_bytes`` more, or one add's rows
    while it is larger); ``enabled=False`` keeps only rows that are not yet committed,
    so every sample of committed data reads from disk.
    ``column_cache_bytes``: budget of the column cache of small keys (see
    :mod:`zreplay.engine.colcache`; default the machine's RAM, in a local file the page
    cache serves; none when ``enabled=False``).
    """

    enabled: bool = True
    trajectories: int | None = 5
    max_bytes: int | None = None
    column_cache_bytes: int | None = None

    def __post_init__(self):
        for name in ("trajectories", "max_bytes", "column_cache_bytes"):
            v = getattr(self, name)
            if v is not None:
                label = {"trajectories": "cache_size", "max_bytes": "ram_budget_bytes"}
                setattr(self, name, as_int(v, label.get(name, name), minimum=0))

    @property
    def column_budget(self) -> int:
        if self.column_cache_bytes is not None:
            return int(self.column_cache_bytes)
        from .colcache import default_budget

        return default_budget() if self.enabled else 0

    def window_for(self, schema: Schema, traj_rows: int, capacity: int | None = None) -> int:
        """Committed rows kept in RAM (the tier proper): about ``trajectories`` of
        ``traj_rows`` rows, never more than ``max_bytes`` of rows, nor than the buffer's
        ``capacity`` (rows it keeps at all); none when disabled."""
        if not self.enabled:
            return 0
        rows = (self.trajectories or 0) * traj_rows
        if self.max_bytes is not None:
            budget = self.max_bytes // max(1, schema.row_bytes)
            rows = budget if not self.trajectories else min(rows, budget)
        return rows if capacity is None else min(rows, capacity)

    def rows_for(
        self, schema: Schema, traj_rows: int, staging_rows: int, capacity: int | None = None
    ) -> int:
        """Slots of the ring: the window, or room for one add of ``traj_rows`` rows plus
        a second while the first is written (as far as ``staging_rows`` allows), if that
        is more.  Slots beyond the window hold rows not yet committed (staging)."""
        staged = traj_rows + min(traj_rows, max(0, staging_rows))
        return max(self.window_for(schema, traj_rows, capacity), staged)
