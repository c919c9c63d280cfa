"""Episodes: the persisted episode table and the row arithmetic of clips and n-step samples.

Rows are stored env-major per trajectory, so each environment lane of a trajectory is a
contiguous run of rows.  At ``add`` time every lane is cut after each step whose
``terminations``/``truncations`` (or ``dones``) flag is set; each resulting run is one
*piece*: ``start`` (segment row), ``length``, ``episode`` (id, unique in the segment),
``step`` (position of the piece's first row inside its episode), ``terminated`` and
``truncated`` (the flags of the piece's last step; both False while the episode goes on or
when it was cut without a flag).  An episode is all pieces with the same id: one piece
when it lies inside one trajectory, several when the producer declared that a lane
continues into the next trajectory (``continues=``).  Pieces are computed once, at add
time, and stored under ``episodes/`` in the segment; sampling never looks at flags.

:class:`EpisodeView` turns the visible pieces into per-episode arrays (length, flags) and
maps ``(episode, step)`` to rows with one ``searchsorted`` (or plain addition when every
episode is one piece, the common case).  Clip and n-step planners (``clips.py``, ``nstep.py``)
draw on top of it and return, per key, the rows to gather: gathering is the caller's
business (RAM tier, disk or a view over several segments).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .columns import GrowingColumns
from .errors import SchemaError

PIECE_COLUMNS: dict[str, str] = {
    "start": "int64",
    "length": "int64",
    "episode": "int64",
    "step": "int64",
    "terminated": "bool",
    "truncated": "bool",
}

TERMINATION_KEYS = ("terminations", "terminated")
TRUNCATION_KEYS = ("truncations", "truncated")
DONE_KEYS = ("dones", "done")
REWARD_KEYS = ("rewards", "reward")
OBS_KEYS = ("obs", "observation", "observations", "curr_obs", "pixels", "state")
ACTION_KEYS = ("action",)
PAD_MODES = ("zero", "repeat")


def _flag(columns: Mapping[str, np.ndarray], names: tuple, T: int, B: int) -> np.ndarray | None:
    """The first present flag column as ``[T, B]`` bool (trailing dims reduced with any)."""
    for name in names:
        if name in columns:
            a = np.asarray(columns[name]).reshape(T, B, -1)
            k = a.shape[2]
            if k == 0:
                return np.zeros((T, B), bool)
            if a.dtype != bool:
                a = a != 0
            if k > 16:
                return a.any(axis=2)
            # numpy's any() over a short trailing axis costs ~85 us per 10k rows (it was
            # most of an add's episode split); k column ORs cost ~2 us each.
            out = a[..., 0].copy()
            for j in range(1, k):
                out |= a[..., j]
            return out
    return None


@dataclass
class Lanes:
    """Open episodes at the end of a writer's last trajectory, per lane (-1: none)."""

    episode: np.ndarray
    next_step: np.ndarray

    @classmethod
    def closed(cls, B: int) -> Lanes:
        return cls(np.full(B, -1, np.int64), np.zeros(B, np.int64))


def split_pieces(
    columns: Mapping[str, np.ndarray],
    T: int,
    B: int,
    row0: int,
    next_episode: int,
    *,
    lanes: Lanes | None,
    continues=False,
    split: bool = True,
) -> tuple[dict[str, np.ndarray], Lanes, int]:
    """Pieces of one ``[T, B]`` trajectory whose first row is ``row0``.

    ``continues`` (bool or ``[B]`` bools): lane ``b``'s first step continues the episode
    left open by lane ``b`` of the previous trajectory (``lanes``), if one is open.
    ``split=False``: each lane is exactly one episode piece (flags only label its end).
    Returns the pieces, the lanes left open, and the next unused episode id.
    """
    term = _flag(columns, TERMINATION_KEYS, T, B)
    trunc = _flag(columns, TRUNCATION_KEYS, T, B)
    done = _flag(columns, DONE_KEYS, T, B)
    zeros = np.zeros((T, B), bool)
    if term is None and trunc is None and done is not None:
        term = done  # only `dones`: an end of unknown cause counts as a termination
    term = zeros if term is None else term
    trunc = zeros if trunc is None else trunc
    end = term | trunc if done is None else term | trunc | done
    # Pieces end at flagged steps and at each lane's last step, in env-major flat order
    # (= storage row order: row = b * T + t); flags are sparse, so only they are visited.
    stops = np.arange(T - 1, T * B, T)
    if split:
        f = np.flatnonzero(end)  # t * B + b (2-D np.nonzero is ~10x slower)
        stops = np.union1d((f % B) * T + f // B, stops)
    st_t, st_b = stops % T, stops // T
    starts = np.concatenate([[0], stops[:-1] + 1])
    length = stops - starts + 1
    lane = starts // T
    t0 = starts - lane * T
    n = len(starts)

    episode = next_episode + np.arange(n, dtype=np.int64)
    step = np.zeros(n, np.int64)
    cont = np.broadcast_to(np.asarray(continues, bool), (B,))
    if lanes is not None and cont.any():
        if len(lanes.episode) != B:
            raise SchemaError(
                f"continues=True needs the same number of environments as the previous "
                f"trajectory ({len(lanes.episode)}), got B={B}"
            )
        first = np.flatnonzero(t0 == 0)  # first piece of each lane, in lane order
        joins = cont & (lanes.episode >= 0)
        episode[first[joins]] = lanes.episode[joins]
        step[first[joins]] = lanes.next_step[joins]
        fresh = np.ones(n, bool)
        fresh[first[joins]] = False
        episode[fresh] = next_episode + np.arange(int(fresh.sum()), dtype=np.int64)
        next_episode += int(fresh.sum())
    else:
        next_episode += n
    ended = end[st_t, st_b] | (not split)
    last = np.flatnonzero(t0 + length == T)  # last piece of each lane
    still_open = ~ended[last]
    out_lanes = Lanes.closed(B)
    out_lanes.episode[still_open] = episode[last[still_open]]
    out_lanes.next_step[still_open] = step[last[still_open]] + length[last[still_open]]
    p_trunc = trunc[st_t, st_b]
    p_term = term[st_t, st_b]
    if done is not None:  # a `dones` stop without either flag: a termination, as above
        p_term = p_term | (done[st_t, st_b] & ~p_trunc)
    pieces = {
        "start": row0 + starts.astype(np.int64),
        "length": length.astype(np.int64),
        "episode": episode,
        "step": step,
        "terminated": p_term,
        "truncated": p_trunc & ~p_term,
    }
    return pieces, out_lanes, next_episode


def lanes_after(pieces: Mapping[str, np.ndarray], row0: int, T: int, B: int) -> Lanes:
    """The open lanes left by the trajectory whose pieces (rows from ``row0``) are given."""
    lanes = Lanes.closed(B)
    start, length = pieces["start"], pieces["length"]
    rel = start - row0
    lane, t0 = rel // T, rel % T
    last = np.flatnonzero(t0 + length == T)
    is_open = ~(pieces["terminated"][last] | pieces["truncated"][last])
    # An unflagged lane end may also be a closed episode (split=False or a cut); it only
    # joins the next trajectory if that one says ``continues``, which is the same rule.
    sel = last[is_open]
    lanes.episode[lane[sel]] = pieces["episode"][sel]
    lanes.next_step[lane[sel]] = pieces["step"][sel] + length[sel]
    return lanes


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
        ep = np.searchsorted(cum, k, side="right")
        start = np.where(ep > 0, cum[np.maximum(ep - 1, 0)], 0)
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
