"""Named append-only arrays with amortised growth (the in-RAM index tables)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class GrowingColumns:
    """Arrays of one length ``n`` (name -> ``(dtype, row shape)``), appended in place.

    Growth copies into new, larger arrays and never writes rows below ``n`` again, so a
    slice handed out earlier stays valid.  ``initial`` holds the first ``n`` rows of some
    or all columns (missing ones start as zeros); those arrays are adopted as they are
    (no copy: an index read at open is often most of a buffer's metadata, and copying it
    into fresh memory cost more than reading it), so the first append grows them.
    """

    def __init__(
        self,
        spec: Mapping[str, tuple[str, tuple[int, ...]]],
        initial: Mapping[str, np.ndarray] | None = None,
        n: int = 0,
        min_capacity: int = 16,
    ):
        self.n = n
        cap = n if initial is not None and n else max(min_capacity, 2 * n)
        self._cols: dict[str, np.ndarray] = {}
        for name, (dtype, row) in spec.items():
            given = initial.get(name) if initial is not None and n else None
            if given is not None and np.shape(given) == (n, *row):
                self._cols[name] = np.ascontiguousarray(given, dtype)
            else:
                arr = np.zeros((cap, *row), dtype)
                if given is not None:
                    arr[:n] = given
                self._cols[name] = arr

    @property
    def capacity(self) -> int:
        return len(next(iter(self._cols.values())))

    def column(self, name: str) -> np.ndarray:
        return self._cols[name][: self.n]

    def columns_range(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {k: v[start:stop].copy() for k, v in self._cols.items()}

    def append(self, rows: Mapping[str, np.ndarray], k: int) -> None:
        """Append ``k`` rows (``rows[name]`` broadcastable to ``[k, *row]``)."""
        self.stage(rows, k)
        self.n += k

    def stage(self, rows: Mapping[str, np.ndarray], k: int) -> None:
        """Write ``k`` rows past the end without making them part of the columns (``n``
        does not move; the caller adds ``k`` to ``n`` to publish them).  An exception
        leaves the visible rows as they were."""
        if self.n + k > self.capacity:
            cap = max(2 * self.capacity, self.n + k, 16)
            grown = {}
            for name, arr in self._cols.items():
                new = np.zeros((cap, *arr.shape[1:]), arr.dtype)
                new[: self.n] = arr[: self.n]
                grown[name] = new
            self._cols = grown
        for name, arr in self._cols.items():
            arr[self.n : self.n + k] = rows[name]
