"""The in-RAM trajectory table of one segment and the row arithmetic over it.

``offsets[i]`` is the first global row of trajectory ``i`` and ``offsets[i + 1]`` one past
its last (so ``offsets[0] == 0`` and ``offsets[n] == n_rows``).  Trajectory ``i`` holds
``T[i] * B[i]`` rows in env-major order: row ``offsets[i] + b * T[i] + t`` is step ``t`` of
environment ``b``.  Trajectories ``[low, n)`` are visible; lower ones were evicted.
Trajectory ``i``'s episode pieces are ``pieces[piece_end[i-1] : piece_end[i]]``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .episodes import EpisodeView, PieceTable
from .store.segment import TRAJ_COLUMNS


def time_major(rows: np.ndarray, T: int, B: int) -> np.ndarray:
    """One trajectory's env-major rows ``[B*T, ...]`` as ``[T, B, ...]`` (a view)."""
    return np.swapaxes(rows.reshape(B, T, *rows.shape[1:]), 0, 1)


class TrajectoryIndex:
    """Append-only columns with amortised growth; readers take cheap snapshots."""

    def __init__(self, columns: Mapping[str, np.ndarray] | None = None, low: int = 0):
        columns = dict(columns or {})
        off = np.asarray(columns.pop("offsets", np.zeros(1, np.int64)), np.int64)
        self.pieces = PieceTable(columns.pop("pieces", None))
        self._view: EpisodeView | None = None
        self.n = len(off) - 1
        self.low = low
        cap = max(16, 2 * self.n)
        self._offsets = np.zeros(cap + 1, np.int64)
        self._offsets[: self.n + 1] = off
        self._cols: dict[str, np.ndarray] = {}
        for name, (dtype, row) in TRAJ_COLUMNS.items():
            arr = np.zeros((cap, *row), dtype)
            if name in columns:
                arr[: self.n] = columns[name]
            self._cols[name] = arr
        self._set_low(low)

    # -- views ----------------------------------------------------------------------

    @property
    def offsets(self) -> np.ndarray:
        """``offsets[: n + 1]`` (a view; append never mutates existing entries)."""
        return self._offsets[: self.n + 1]

    def column(self, name: str) -> np.ndarray:
        return self._cols[name][: self.n]

    @property
    def n_rows(self) -> int:
        return int(self._offsets[self.n])

    @property
    def low_row(self) -> int:
        return int(self._offsets[self.low])

    @property
    def num_visible(self) -> int:
        return self.n - self.low

    @property
    def visible_rows(self) -> int:
        return self.n_rows - self.low_row

    def window(self, size: int) -> tuple[int, int]:
        """Row range ``[lo, hi)`` of the last ``size`` visible trajectories (0 = all)."""
        first = self.low if size <= 0 else max(self.low, self.n - size)
        return int(self._offsets[first]), self.n_rows

    def locate(self, rows: np.ndarray) -> np.ndarray:
        """Trajectory index holding each global row (vectorised ``searchsorted``)."""
        return np.searchsorted(self.offsets, rows, side="right") - 1

    # -- mutation -------------------------------------------------------------------

    def episodes(self) -> EpisodeView:
        """Episodes of the visible trajectories (cached until the next append/eviction)."""
        view = self._view
        if view is None:
            view = self._view = EpisodeView(self.pieces.visible())
        return view

    def append(
        self,
        T: int,
        B: int,
        trajectory_id: int,
        max_episode_length: int,
        weights_id: bytes,
        pieces: Mapping[str, np.ndarray],
    ) -> int:
        """Add one trajectory of ``T * B`` rows and its episode pieces; returns its index."""
        if self.n + 1 >= len(self._offsets) - 1:
            self._reserve(2 * (self.n + 1))
        i = self.n
        self._offsets[i + 1] = self._offsets[i] + T * B
        c = self._cols
        c["trajectory_id"][i] = trajectory_id
        c["T"][i] = T
        c["B"][i] = B
        c["max_episode_length"][i] = max_episode_length
        wid = c["model_weights_id"][i]
        wid[:] = 0
        wid[: len(weights_id)] = np.frombuffer(weights_id, np.uint8)
        self.pieces.append(pieces)
        c["piece_end"][i] = self.pieces.n
        self.n = i + 1
        self._view = None
        return i

    def _reserve(self, cap: int) -> None:
        off = np.zeros(cap + 1, np.int64)
        off[: self.n + 1] = self._offsets[: self.n + 1]
        self._offsets = off
        for name, arr in self._cols.items():
            new = np.zeros((cap, *arr.shape[1:]), arr.dtype)
            new[: self.n] = arr[: self.n]
            self._cols[name] = new

    def evict_to(self, max_rows: int) -> None:
        """Advance ``low`` past whole oldest trajectories until at most ``max_rows`` remain."""
        if self.visible_rows <= max_rows:
            return
        need_low_row = self.n_rows - max_rows
        self._set_low(int(np.searchsorted(self.offsets, need_low_row, side="left")))

    def _set_low(self, low: int) -> None:
        self.low = low
        self.pieces.low = int(self._cols["piece_end"][low - 1]) if low > 0 else 0
        self._view = None

    def weights_id(self, i: int) -> str:
        raw = self._cols["model_weights_id"][i].tobytes()
        return raw.rstrip(b"\0").decode("utf-8")

    def columns_range(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {name: arr[start:stop].copy() for name, arr in self._cols.items()}
