"""Cutting a new trajectory's environment lanes into episode pieces, at add time.

Each lane is cut after every step whose termination/truncation (or done) flag is set
(column names in :mod:`zreplay.conventions`; trailing dimensions are OR-ed); each run is
one piece (see :mod:`zreplay.index.episodes`).  A lane may continue the episode the same
lane of the writer's previous trajectory left open (``continues=``): :class:`Lanes` is
what carries over from one trajectory to the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..conventions import DONE_KEYS, TERMINATION_KEYS, TRUNCATION_KEYS
from ..errors import SchemaError


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
        if f.size:  # no flag set (most adds of long rollouts): one piece per lane
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
