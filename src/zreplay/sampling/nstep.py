"""n-step transitions: returns over up to ``n`` steps inside an episode, the bootstrap
discount, the observation to bootstrap from, and frame stacks, planned as gather requests
over an :class:`~zreplay.index.episodes.EpisodeView`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..conventions import NEXT_OBS, OBS_KEYS, REWARD_KEYS
from ..errors import SchemaError
from ..index.episodes import EpisodeView
from ..numbers import as_float, as_int
from .clips import PAD_MODES


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
        self.n = as_int(self.n, "n", minimum=1)
        self.gamma = as_float(self.gamma, "gamma")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1], got {self.gamma}")
        self.frame_stack = as_int(self.frame_stack, "frame_stack", minimum=1)
        if self.pad not in PAD_MODES:
            raise ValueError(f"pad must be 'zero' or 'repeat', got {self.pad!r}")

    def resolve(self, keys: list[str]) -> tuple[str, str, list[str], dict[str, str]]:
        """(reward key, observation root, observation keys under it, obs key -> stored
        next key) for a stored key set."""
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
        if root is None and obs_root != NEXT_OBS:
            root = NEXT_OBS if any(k.startswith(NEXT_OBS) for k in keys) else None
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
        return reward, obs_root, obs, nxt


def next_name(obs_root: str, key: str) -> str:
    """Output name of the n-step next observation of ``key`` (under ``obs_root``): it
    mirrors the observation group under ``next_obs`` (``obs/pixels`` -> ``next_obs/pixels``
    for root ``obs``; ``obs`` -> ``next_obs``)."""
    return NEXT_OBS + key[len(obs_root) :]


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
    for name in [n for n in out if n.startswith("@next/")]:
        out[next_name(obs_root, name[len("@next/") :])] = out.pop(name)
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
