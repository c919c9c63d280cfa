"""Episodes: the persisted episode table and the row arithmetic over it.

Rows are stored env-major per trajectory, so each environment lane of a trajectory is a
contiguous run of rows.  At ``add`` time every lane is cut into *pieces* (see
:mod:`zreplay.index.split`): ``start`` (segment row), ``length``, ``episode`` (id, unique
in the segment), ``step`` (position of the piece's first row inside its episode),
``terminated`` and ``truncated`` (the flags of the piece's last step; both False while
the episode goes on or when it was cut without a flag).  An episode is all pieces with
the same id: one piece when it lies inside one trajectory, several when the producer
declared that a lane continues into the next trajectory.  Pieces are computed once, at
add time, and stored under ``episodes/`` in the segment; sampling never looks at flags.

:class:`EpisodeView` turns the visible pieces into per-episode arrays (length, flags) and
maps ``(episode, step)`` to rows with one ``searchsorted`` (or plain addition when every
episode is one piece, the common case).  Clip and n-step planners
(:mod:`zreplay.sampling`) draw on top of it and return, per key, the rows to gather.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..store.format import PIECE_COLUMNS
from .columns import GrowingColumns


class PieceTable(GrowingColumns):
    """Append-only piece columns; ``low`` = first visible piece."""

    def __init__(self, columns: Mapping[str, np.ndarray] | None = None, low: int = 0):
        n = len(columns["start"]) if columns else 0
        spec = {name: (dtype, ()) for name, dtype in PIECE_COLUMNS.items()}
        super().__init__(spec, columns, n, min_capacity=64)
        self.low = low

    def visible(self) -> dict[str, np.ndarray]:
        return {k: v[self.low : self.n] for k, v in self._cols.items()}

    def append(self, pieces: Mapping[str, np.ndarray]) -> None:
        super().append(pieces, len(pieces["start"]))


class EpisodeView:
    """Per-episode arrays over a set of pieces (oldest episode first) and the
    ``(episode, step) -> row`` map.  Steps count from the first *visible* step of an
    episode (an episode whose first trajectories were evicted starts later)."""

    def __init__(self, pieces: Mapping[str, np.ndarray]):
        ep = np.asarray(pieces["episode"], np.int64)
        n = len(ep)
        if n and not np.all(ep[1:] > ep[:-1]):
            order = np.argsort(ep, kind="stable")  # pieces of one episode stay in step order
            p = {k: np.asarray(v)[order] for k, v in pieces.items()}
        else:
            p = {k: np.asarray(v) for k, v in pieces.items()}
        ep = p["episode"]
        if n:
            first = np.flatnonzero(np.concatenate([[True], ep[1:] != ep[:-1]]))
            last = np.concatenate([first[1:], [n]]) - 1
            self.length = np.add.reduceat(p["length"], first)
        else:
            first = last = np.zeros(0, np.int64)
            self.length = np.zeros(0, np.int64)
        self.ids = ep[first]
        self.first_step = p["step"][first]
        self.terminated = p["terminated"][last]
        self.truncated = p["truncated"][last]
        self.multi = len(first) != n
        self._row0 = p["start"][first]
        if self.multi:
            self._vbase = np.concatenate([[0], np.cumsum(self.length)[:-1]])
            self._p_vstart = np.concatenate([[0], np.cumsum(p["length"])[:-1]])
            self._p_row = p["start"]
            self._p_len = p["length"]
            self._p_episode = np.repeat(np.arange(len(first)), np.diff(np.append(first, n)))
        self._cum: dict[tuple, np.ndarray] = {}
        self._derived: dict[tuple, object] = {}

    def __len__(self) -> int:
        return len(self.length)

    def rows(self, episode: np.ndarray, step: np.ndarray) -> np.ndarray:
        """Rows of ``step`` (each inside ``[0, length[episode])``) of ``episode``."""
        if not self.multi:
            return self._row0[episode] + step
        v = self._vbase[episode] + step
        j = np.searchsorted(self._p_vstart, v, side="right") - 1
        return self._p_row[j] + (v - self._p_vstart[j])

    def locate_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Inverse of :meth:`rows`: ``(episode, step)`` int64 of each row, episode -1 for
        a row no visible episode holds.  One ``searchsorted`` over pieces sorted by row."""
        rows = np.asarray(rows, np.int64)
        start, length, episode, vstep = self.cached(("by_row",), self._pieces_by_row)
        if not len(start):
            return np.full(rows.shape, -1, np.int64), np.zeros(rows.shape, np.int64)
        j = np.maximum(np.searchsorted(start, rows, side="right") - 1, 0)
        within = rows - start[j]
        inside = (within >= 0) & (within < length[j])
        return np.where(inside, episode[j], -1), np.where(inside, vstep[j] + within, 0)

    def _pieces_by_row(self) -> tuple[np.ndarray, ...]:
        """Pieces as ``(start, length, episode, first visible step)``, sorted by row."""
        if self.multi:
            ep = self._p_episode
            cols = (self._p_row, self._p_len, ep, self._p_vstart - self._vbase[ep])
        else:
            n = len(self.length)
            cols = (self._row0, self.length, np.arange(n), np.zeros(n, np.int64))
        start = cols[0]
        if len(start) > 1 and not np.all(start[1:] > start[:-1]):
            order = np.argsort(start, kind="stable")
            cols = tuple(c[order] for c in cols)
        return tuple(np.asarray(c, np.int64) for c in cols)

    def cached(self, key: tuple, make):
        """A value derived from this view, computed once (``make()``) and kept with it."""
        got = self._derived.get(key)
        if got is None:
            got = self._derived[key] = make()
        return got

    # -- counting and locating units (clips, transitions) ---------------------------

    def cumulative(self, key: tuple, counts) -> np.ndarray:
        """Cached inclusive cumsum of per-episode unit counts (``counts()`` if missing)."""
        cum = self._cum.get(key)
        if cum is None:
            cum = self._cum[key] = np.cumsum(counts(), dtype=np.int64)
        return cum

    @staticmethod
    def locate(cum: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flat unit index -> (episode, index of the unit inside the episode)."""
        ep = cum.searchsorted(k, side="right")
        # (cum[-1] for episode 0 is replaced by 0: no episode before it)
        start = cum.take(ep - 1, mode="wrap")
        start[ep == 0] = 0
        return ep, k - start


def concat_pieces(parts: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Pieces of several segments as one set (episode ids offset to stay distinct and
    increasing segment after segment; ``start`` must already be in one row space)."""
    out = {k: [] for k in PIECE_COLUMNS}
    base = 0
    for p in parts:
        if not len(p["start"]):
            continue
        ep = np.asarray(p["episode"], np.int64)
        lo = int(ep.min())
        for k in PIECE_COLUMNS:
            out[k].append(ep - lo + base if k == "episode" else np.asarray(p[k]))
        base += int(ep.max()) - lo + 1
    return {k: np.concatenate(v) if v else np.zeros(0, PIECE_COLUMNS[k]) for k, v in out.items()}
