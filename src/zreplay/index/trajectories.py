"""The in-RAM trajectory table of one segment and the row arithmetic over it.

``offsets[i]`` is the first global row of trajectory ``i`` and ``offsets[i + 1]`` one past
its last (so ``offsets[n] == n_rows``; ``offsets[0]`` is the segment's first row: 0, or
where a ``clear()`` left off, since rows are never reused).  Trajectory ``i`` holds
``T[i] * B[i]`` rows in env-major order: row ``offsets[i] + b * T[i] + t`` is step ``t`` of
environment ``b``.  Trajectories ``[low, n)`` are visible; lower ones were evicted.
Trajectory ``i``'s episode pieces are ``pieces[piece_end[i-1] : piece_end[i]]``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..store.format import TRAJ_COLUMNS, WEIGHTS_ID_BYTES
from .columns import GrowingColumns
from .coords import positions_of
from .episodes import EpisodeView, PieceTable


def time_major(rows: np.ndarray, T: int, B: int) -> np.ndarray:
    """One trajectory's env-major rows ``[B*T, ...]`` as ``[T, B, ...]`` (a view)."""
    return np.swapaxes(rows.reshape(B, T, *rows.shape[1:]), 0, 1)


class TrajectoryIndex:
    """Append-only columns with amortised growth; readers take cheap snapshots."""

    def __init__(
        self, columns: Mapping[str, np.ndarray] | None = None, low: int = 0, first_row: int = 0
    ):
        columns = dict(columns or {})
        off = np.asarray(columns.pop("offsets", np.full(1, first_row, np.int64)), np.int64)
        self.pieces = PieceTable(columns.pop("pieces", None))
        self._view: EpisodeView | None = None
        self.n = len(off) - 1
        self.low = low
        self._cols = GrowingColumns(TRAJ_COLUMNS, columns, self.n)
        self._offsets = np.zeros(self._cols.capacity + 1, np.int64)
        self._offsets[: self.n + 1] = off
        self._set_low(low)

    # -- views ----------------------------------------------------------------------

    @property
    def offsets(self) -> np.ndarray:
        """``offsets[: n + 1]`` (a view; append never mutates existing entries)."""
        return self._offsets[: self.n + 1]

    def column(self, name: str) -> np.ndarray:
        return self._cols.column(name)

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
        """Episodes of the visible trajectories, rows as positions (its oldest visible
        row at 0, as a writer's snapshot lays them; cached until the next
        append/eviction)."""
        view = self._view
        if view is None:
            pieces = dict(self.pieces.visible())
            pieces["start"] = positions_of(pieces["start"], self.low_row, 0)
            view = self._view = EpisodeView(pieces)
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
        self.append_many([(T, B, trajectory_id, max_episode_length, weights_id, pieces)])
        return self.n - 1

    def append_many(self, entries: list[tuple]) -> None:
        """Add trajectories ``(T, B, trajectory_id, max_episode_length, weights_id,
        pieces)`` all at once, or none of them: everything is converted and written past
        the end first, and the counters move last (an exception, an overflowing value
        included, leaves the index as it was)."""
        k = len(entries)
        if not k:
            return
        sizes = np.array([int(T) * int(B) for T, B, *_ in entries], np.int64)
        wid = np.zeros((k, WEIGHTS_ID_BYTES), np.uint8)
        for j, e in enumerate(entries):
            wid[j, : len(e[4])] = np.frombuffer(e[4], np.uint8)
        parts = [e[5] for e in entries]
        counts = np.array([len(p["start"]) for p in parts], np.int64)
        pieces = {c: np.concatenate([np.asarray(p[c]) for p in parts]) for c in parts[0]}
        row = {
            "trajectory_id": np.array([e[2] for e in entries], np.int64),
            "T": np.array([e[0] for e in entries], np.int64),
            "B": np.array([e[1] for e in entries], np.int64),
            "max_episode_length": np.array([e[3] for e in entries], np.int64),
            "model_weights_id": wid,
            "piece_end": self.pieces.n + np.cumsum(counts),
        }
        i = self.n
        if i + k + 1 > len(self._offsets):  # grows like the columns (new array, old rows copied)
            off = np.zeros(max(2 * len(self._offsets), i + k + 1), np.int64)
            off[: i + 1] = self._offsets[: i + 1]
            self._offsets = off
        self._offsets[i + 1 : i + k + 1] = self._offsets[i] + np.cumsum(sizes)
        self.pieces.stage(pieces, int(counts.sum()))
        self._cols.stage(row, k)
        # Publish: plain integer assignments only from here on.
        self.pieces.n += int(counts.sum())
        self._cols.n += k
        self.n = i + k
        self._view = None

    def evict_to(self, max_rows: int) -> None:
        """Advance ``low`` past whole oldest trajectories until at most ``max_rows`` remain."""
        if self.visible_rows <= max_rows:
            return
        need_low_row = self.n_rows - max_rows
        self._set_low(int(np.searchsorted(self.offsets, need_low_row, side="left")))

    def _set_low(self, low: int) -> None:
        self.low = low
        self.pieces.low = int(self._cols.column("piece_end")[low - 1]) if low > 0 else 0
        self._view = None

    def weights_id(self, i: int) -> str:
        raw = self._cols.column("model_weights_id")[i].tobytes()
        return raw.rstrip(b"\0").decode("utf-8")

    def metadata(self, i: int) -> dict:
        """Trajectory ``i``'s ``trajectory_id``, ``max_episode_length``, ``model_weights_id``,
        ``T`` and ``B``."""
        col = self._cols.column
        return {
            "trajectory_id": int(col("trajectory_id")[i]),
            "max_episode_length": int(col("max_episode_length")[i]),
            "model_weights_id": self.weights_id(i),
            "T": int(col("T")[i]),
            "B": int(col("B")[i]),
        }

    def continues(self, i: int) -> np.ndarray:
        """Lanes (bool ``[B]``) of trajectory ``i`` whose first step continues an episode
        of trajectory ``i - 1`` (what ``continues=`` said when it was added)."""
        B, T = int(self.column("B")[i]), int(self.column("T")[i])
        cont = np.zeros(B, bool)
        if i <= self.low:
            return cont
        ends = self.column("piece_end")
        lo, hi = int(ends[i - 1]), int(ends[i])
        start, step = self.pieces.column("start")[lo:hi], self.pieces.column("step")[lo:hi]
        rel = start - int(self._offsets[i])
        first = rel % T == 0
        cont[rel[first] // T] = step[first] > 0
        return cont

    def columns_range(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return self._cols.columns_range(start, stop)
