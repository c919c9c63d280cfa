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
episode is one piece, the common case).  Clip and n-step planners draw on top of it and
return, per key, the rows to gather: gathering is the caller's business (RAM tier, disk or
a view over several segments).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

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
            return a.any(axis=2) if a.shape[2] else np.zeros((T, B), bool)
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
    # env-major flat order = storage row order: row = b * T + t
    term_f, trunc_f = term.T.reshape(-1), trunc.T.reshape(-1)
    stop = end.T.reshape(-1).copy() if split else np.zeros(T * B, bool)
    stop[T - 1 :: T] = True
    stops = np.flatnonzero(stop)
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
    ended = end.T.reshape(-1)[stops] | (not split)
    last = np.flatnonzero(t0 + length == T)  # last piece of each lane
    still_open = ~ended[last]
    out_lanes = Lanes.closed(B)
    out_lanes.episode[still_open] = episode[last[still_open]]
    out_lanes.next_step[still_open] = step[last[still_open]] + length[last[still_open]]
    pieces = {
        "start": row0 + starts.astype(np.int64),
        "length": length.astype(np.int64),
        "episode": episode,
        "step": step,
        "terminated": term_f[stops],
        "truncated": trunc_f[stops] & ~term_f[stops],
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


class PieceTable:
    """Append-only piece columns with amortised growth; ``low`` = first visible piece."""

    def __init__(self, columns: Mapping[str, np.ndarray] | None = None, low: int = 0):
        columns = columns or {}
        self.n = len(columns.get("start", ()))
        self.low = low
        cap = max(64, 2 * self.n)
        self._cols = {}
        for name, dtype in PIECE_COLUMNS.items():
            arr = np.zeros(cap, dtype)
            if self.n:
                arr[: self.n] = columns[name]
            self._cols[name] = arr

    def column(self, name: str) -> np.ndarray:
        return self._cols[name][: self.n]

    def visible(self) -> dict[str, np.ndarray]:
        return {k: v[self.low : self.n] for k, v in self._cols.items()}

    def columns_range(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {k: v[start:stop].copy() for k, v in self._cols.items()}

    def append(self, pieces: Mapping[str, np.ndarray]) -> None:
        k = len(pieces["start"])
        if self.n + k > len(self._cols["start"]):
            cap = max(2 * len(self._cols["start"]), self.n + k)
            for name, arr in self._cols.items():
                new = np.zeros(cap, arr.dtype)
                new[: self.n] = arr[: self.n]
                self._cols[name] = new
        for name, arr in self._cols.items():
            arr[self.n : self.n + k] = pieces[name]
        self.n += k


class EpisodeView:
    """Per-episode arrays over a set of pieces (oldest episode first) and the
    ``(episode, step) -> row`` map.  Steps count from the first *visible* step of an
    episode (an episode whose first trajectories were evicted starts later)."""

    def __init__(self, pieces: Mapping[str, np.ndarray]):
        ep = np.asarray(pieces["episode"], np.int64)
        n = len(ep)
        self.num_pieces = n
        if n and not np.all(ep[1:] > ep[:-1]):
            order = np.argsort(ep, kind="stable")  # pieces of one episode stay in step order
            p = {k: np.asarray(v)[order] for k, v in pieces.items()}
        else:
            p = {k: np.asarray(v) for k, v in pieces.items()}
        ep = p["episode"]
        first = np.flatnonzero(np.concatenate([[True], ep[1:] != ep[:-1]])) if n else ep
        last = np.concatenate([first[1:], [n]]) - 1 if n else ep
        self.ids = ep[first]
        self.length = np.add.reduceat(p["length"], first) if n else np.zeros(0, np.int64)
        self.first_step = p["step"][first] if n else np.zeros(0, np.int64)
        self.terminated = p["terminated"][last] if n else np.zeros(0, bool)
        self.truncated = p["truncated"][last] if n else np.zeros(0, bool)
        self.multi = len(first) != n
        self._row0 = p["start"][first] if n else np.zeros(0, np.int64)
        if self.multi:
            self._vbase = np.concatenate([[0], np.cumsum(self.length)[:-1]])
            self._p_vstart = np.concatenate([[0], np.cumsum(p["length"])[:-1]])
            self._p_row = p["start"]
        self._cum: dict[tuple, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.length)

    @property
    def num_steps(self) -> int:
        return int(self.length.sum())

    def rows(self, episode: np.ndarray, step: np.ndarray) -> np.ndarray:
        """Rows of ``step`` (each inside ``[0, length[episode])``) of ``episode``."""
        if not self.multi:
            return self._row0[episode] + step
        v = self._vbase[episode] + step
        j = np.searchsorted(self._p_vstart, v, side="right") - 1
        return self._p_row[j] + (v - self._p_vstart[j])

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


# -- clips ---------------------------------------------------------------------------


@dataclass
class ClipSpec:
    """``history_len`` frames ``frameskip`` apart; ``action_keys`` dense over the span."""

    history_len: int = 1
    frameskip: int = 1
    pad: str | None = None
    action_keys: tuple[str, ...] = ACTION_KEYS

    def __post_init__(self):
        if int(self.history_len) <= 0:
            raise ValueError(f"history_len must be >= 1, got {self.history_len}")
        if int(self.frameskip) <= 0:
            raise ValueError(f"frameskip must be >= 1, got {self.frameskip}")
        if self.pad not in (None, *PAD_MODES):
            raise ValueError(f"pad must be None, 'zero' or 'repeat', got {self.pad!r}")
        self.history_len, self.frameskip = int(self.history_len), int(self.frameskip)
        self.action_keys = tuple(self.action_keys)

    @property
    def span(self) -> int:
        return self.history_len * self.frameskip

    @property
    def pad_left(self) -> int:
        """How far before step 0 a padded clip may start (its last frame stays real)."""
        return (self.history_len - 1) * self.frameskip if self.pad else 0

    def counts(self, view: EpisodeView) -> np.ndarray:
        return np.maximum(0, view.length - self.span + 1 + self.pad_left)

    def cumulative(self, view: EpisodeView) -> np.ndarray:
        return view.cumulative(("clip", self.span, self.pad_left), lambda: self.counts(view))

    def num_clips(self, view: EpisodeView) -> int:
        cum = self.cumulative(view)
        return int(cum[-1]) if len(cum) else 0


@dataclass
class ClipPlan:
    """Rows to gather per key (``[n, h]`` strided or ``[n, span]`` dense) and pad masks."""

    rows: dict[str, np.ndarray]
    pad: dict[str, np.ndarray]
    is_pad: np.ndarray
    episode: np.ndarray
    start: np.ndarray


def plan_clips(view: EpisodeView, spec: ClipSpec, flat: np.ndarray, keys: list[str]) -> ClipPlan:
    """Rows of clips at flat clip indices ``flat`` (in ``[0, spec.num_clips(view))``)."""
    cum = spec.cumulative(view)
    ep, k = EpisodeView.locate(cum, np.asarray(flat, np.int64))
    s0 = k - spec.pad_left
    h, fs = spec.history_len, spec.frameskip
    strided = s0[:, None] + np.arange(h) * fs
    rows_s = view.rows(ep[:, None], np.maximum(strided, 0))
    pad_s = strided < 0
    rows, pad = {}, {}
    dense = None
    for key in keys:
        if _is_action(key, spec.action_keys) and fs > 1:
            if dense is None:
                steps = s0[:, None] + np.arange(h * fs)
                dense = (view.rows(ep[:, None], np.maximum(steps, 0)), steps < 0)
            rows[key], pad[key] = dense
        else:
            rows[key], pad[key] = rows_s, pad_s
    return ClipPlan(rows, pad, pad_s, ep, s0)


def _is_action(key: str, action_keys: tuple[str, ...]) -> bool:
    return any(key == a or key.startswith(a + "/") for a in action_keys)


def finish_clips(
    plan: ClipPlan, gathered: Mapping[str, np.ndarray], spec: ClipSpec
) -> dict[str, np.ndarray]:
    """Gathered ``[n, m, ...]`` rows -> ``[n, h, ...]`` clips (dense actions reshaped to
    ``(h, frameskip * action_dim)``), padded frames zeroed for ``pad="zero"``."""
    out = {}
    h = spec.history_len
    for key, a in gathered.items():
        r = plan.rows[key]
        if spec.pad == "zero":
            m = plan.pad[key]
            if m.any():
                a[m] = 0
        if r.shape[1] != h:  # dense action block
            a = a.reshape(r.shape[0], h, -1)
        out[key] = a
    return out


# -- n-step transitions --------------------------------------------------------------


@dataclass
class NStepSpec:
    """n-step returns over up to ``n`` steps with discount ``gamma``.

    ``obs_key``: the observation array or group; ``next_key``: an array/group mirroring it
    that holds each step's next observation (then the final step of a truncated episode
    can bootstrap); ``frame_stack``: return ``k`` frames ending at the step for every
    observation key (built from frames stored once; ``pad`` at episode starts).
    """

    n: int = 1
    gamma: float = 0.99
    reward_key: str | None = None
    obs_key: str | None = None
    next_key: str | None = None
    frame_stack: int = 1
    pad: str = "zero"

    def __post_init__(self):
        if int(self.n) < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not 0.0 <= float(self.gamma) <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1], got {self.gamma}")
        if int(self.frame_stack) < 1:
            raise ValueError(f"frame_stack must be >= 1, got {self.frame_stack}")
        if self.pad not in PAD_MODES:
            raise ValueError(f"pad must be 'zero' or 'repeat', got {self.pad!r}")
        self.n, self.gamma, self.frame_stack = int(self.n), float(self.gamma), int(self.frame_stack)

    def resolve(self, keys: list[str]) -> tuple[str, list[str], dict[str, str]]:
        """(reward key, observation keys, obs key -> next key) for a stored key set."""
        reward = self.reward_key or next((k for k in REWARD_KEYS if k in keys), None)
        if reward is None or reward not in keys:
            raise SchemaError(f"n-step needs a reward column; pass reward_key= (keys: {keys})")
        obs_root = self.obs_key or next(
            (k for k in OBS_KEYS if any(x == k or x.startswith(k + "/") for x in keys)), None
        )
        if obs_root is None:
            raise SchemaError(f"n-step needs an observation key; pass obs_key= (keys: {keys})")
        obs = [k for k in keys if k == obs_root or k.startswith(obs_root + "/")]
        if not obs:
            raise SchemaError(f"obs_key {obs_root!r} matches no stored key (keys: {keys})")
        nxt: dict[str, str] = {}
        root = self.next_key
        if root is None and obs_root != "next_obs":
            root = "next_obs" if any(k.startswith("next_obs") for k in keys) else None
        if root is not None:
            for k in obs:
                cand = root + k[len(obs_root) :]
                if cand not in keys:
                    if self.next_key is not None:
                        raise SchemaError(
                            f"next_key {self.next_key!r} has no counterpart {cand!r} of {k!r}"
                        )
                    nxt = {}
                    break
                nxt[k] = cand
        return reward, obs, nxt


@dataclass
class NStepPlan:
    """Gather requests ``name -> (stored key, rows of any shape)`` and what to finish with.

    Names: every data key (rows ``[n]``, or ``[n, k]`` frames for stacked observations),
    ``"@next/<obs key>"`` (``[n]`` or ``[n, k]``), ``"@last/<obs key>"`` (the newest
    next frame when it comes from a stored next column under a stack), and ``"@reward"``
    (``[n, N]``).  ``@`` names never collide with stored keys."""

    requests: dict[str, tuple[str, np.ndarray]]
    pad: dict[str, np.ndarray]
    reward_mask: np.ndarray  # [n, N]
    discount: np.ndarray  # [n] float32
    steps: np.ndarray  # [n] int64, steps summed
    terminated: np.ndarray  # [n] bool, the window ends in a termination
    episode: np.ndarray
    step: np.ndarray


def nstep_counts(view: EpisodeView, has_next: bool) -> np.ndarray:
    """Valid transitions per episode: every step, except that without stored next
    observations the last step of an episode that did not terminate has nothing to
    bootstrap from."""
    if has_next:
        return view.length.copy()
    return np.maximum(0, view.length - (~view.terminated).astype(np.int64))


def num_nstep(view: EpisodeView, has_next: bool) -> int:
    cum = view.cumulative(("nstep", has_next), lambda: nstep_counts(view, has_next))
    return int(cum[-1]) if len(cum) else 0


def _stack(view, ep, last, k):
    """Rows and pad mask of ``k`` frames ending at step ``last`` (``[n, k]``)."""
    hist = last[:, None] - np.arange(k - 1, -1, -1)
    return view.rows(ep[:, None], np.maximum(hist, 0)), hist < 0


def plan_nstep(
    view: EpisodeView,
    spec: NStepSpec,
    flat: np.ndarray,
    keys: list[str],
    reward: str,
    obs: list[str],
    nxt: dict[str, str],
) -> NStepPlan:
    has_next = bool(nxt)
    cum = view.cumulative(("nstep", has_next), lambda: nstep_counts(view, has_next))
    ep, t = EpisodeView.locate(cum, np.asarray(flat, np.int64))
    L = view.length[ep]
    term = view.terminated[ep]
    usable = L if has_next else np.where(term, L, L - 1)
    m = np.minimum(spec.n, usable - t)
    ended = term & (t + m == L)
    discount = np.where(ended, 0.0, spec.gamma ** m.astype(np.float64)).astype(np.float32)
    k = np.arange(spec.n)
    rmask = k[None, :] < m[:, None]
    steps = np.minimum(t[:, None] + k, (L - 1)[:, None])
    req = {"@reward": (reward, view.rows(ep[:, None], steps))}
    pad: dict[str, np.ndarray] = {}
    fk = spec.frame_stack
    base = view.rows(ep, t)
    if fk > 1:
        hrows, hpad = _stack(view, ep, t, fk)
    for key in keys:
        if fk > 1 and key in obs:
            req[key], pad[key] = (key, hrows), hpad
        else:
            req[key] = (key, base)
    for key in obs:
        name = "@next/" + key
        if has_next:
            last = t + m - 1  # its next column holds step t+m
            if fk == 1:
                req[name] = (nxt[key], view.rows(ep, last))
            else:  # frames t+m-k+1 .. t+m-1 from the observations, t+m from the next column
                r, p = _stack(view, ep, t + m - 1, fk - 1)
                req[name], pad[name] = (key, r), p
                req["@last/" + key] = (nxt[key], view.rows(ep, last))
        else:
            last = np.minimum(t + m, L - 1)  # == t+m unless the window terminated
            if fk == 1:
                req[name] = (key, view.rows(ep, last))
            else:
                r, p = _stack(view, ep, last, fk)
                req[name], pad[name] = (key, r), p
    return NStepPlan(req, pad, rmask, discount, m.astype(np.int64), ended, ep, t)


def finish_nstep(
    plan: NStepPlan, got: Mapping[str, np.ndarray], spec: NStepSpec, obs_root: str
) -> dict[str, np.ndarray]:
    """Gathered requests -> the flat batch: data keys at ``t``, ``next_obs/...``,
    ``return``, ``discount``, ``n_steps``, ``terminated_n``."""
    out: dict[str, np.ndarray] = {}
    for name, arr in got.items():
        if name == "@reward" or name.startswith("@last/"):
            continue
        if name in plan.pad and spec.pad == "zero" and plan.pad[name].any():
            arr[plan.pad[name]] = 0
        out[name] = arr
    for name, arr in got.items():
        if name.startswith("@last/"):
            key = name[len("@last/") :]
            out["@next/" + key] = np.concatenate([out["@next/" + key], arr[:, None]], 1)
    # rename next_obs/<obs_root>/rest -> next_obs/rest (mirrors the observation group)
    for name in [n for n in out if n.startswith("@next/")]:
        key = name[len("@next/") :]
        rest = key[len(obs_root) :]
        out["next_obs" + rest] = out.pop(name)
    r = got["@reward"].astype(np.float64).reshape(len(plan.discount), spec.n, -1)
    if r.shape[2] != 1:
        raise SchemaError(
            f"n-step returns need one reward per step; the reward rows have {r.shape[2]} "
            "values (sum them per step before storing, or pass reward_key=)"
        )
    disc = spec.gamma ** np.arange(spec.n)
    ret = (r[:, :, 0] * plan.reward_mask * disc).sum(axis=1)
    out["return"] = ret.astype(np.float32)
    out["discount"] = plan.discount
    out["n_steps"] = plan.steps
    out["terminated_n"] = plan.terminated
    return out
