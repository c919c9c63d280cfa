"""Clip and n-step sampling over any row source (a writable engine or a read-only view).

A *gather* is ``gather(fn) -> {name: array}``: the source calls ``fn(episode_view)`` at a
consistent instant (under its lock, or on one refreshed snapshot), ``fn`` returns requests
``{name: (key, rows)}``, and the source gathers them.  Everything here is vectorised: one
``searchsorted`` to locate units, one fancy index (or one batched disk read) per key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from .clips import ClipSpec, finish_clips, plan_clips
from .episodes import EpisodeView
from .errors import EmptyBufferError
from .nstep import NStepSpec, finish_nstep, next_name, num_nstep, plan_nstep

Gather = Callable[[Callable[[EpisodeView], dict]], dict]
Pick = Callable[[EpisodeView, int], np.ndarray]


def group_requests(requests: Mapping[str, tuple[str, np.ndarray]]) -> list[tuple]:
    """Requests that share one rows array (by identity): ``[(rows, [(name, key), ...])]``,
    so a source locates and reads those rows once for all their keys."""
    groups: dict[int, tuple] = {}
    for name, (key, rows) in requests.items():
        groups.setdefault(id(rows), (rows, []))[1].append((name, key))
    return list(groups.values())


def uniform(rng: np.random.Generator, n: int) -> Pick:
    """Pick ``n`` units uniformly with replacement among ``total``."""

    def pick(_view: EpisodeView, total: int) -> np.ndarray:
        return rng.integers(0, total, size=n)

    return pick


def fixed(indices) -> Pick:
    """Pick the given flat unit indices (checked against ``total`` at gather time)."""
    idx = np.asarray(indices, np.int64).reshape(-1)

    def pick(_view: EpisodeView, total: int) -> np.ndarray:
        if len(idx) and (idx.min() < 0 or idx.max() >= total):
            raise IndexError(f"clip index out of range [0, {total})")
        return idx

    return pick


def gather_clips(
    gather: Gather, spec: ClipSpec, keys: list[str], pick: Pick
) -> dict[str, np.ndarray]:
    """Clips ``{key: [n, history_len, ...]}`` (plus ``is_pad`` when padding is on)."""
    box = {}

    def fn(view: EpisodeView) -> dict:
        total = spec.num_clips(view)
        if total == 0:
            raise EmptyBufferError(
                f"no clips of history_len={spec.history_len} (frameskip={spec.frameskip}): "
                f"{len(view)} stored episode(s), none long enough"
                + ("" if spec.pad else "; pass pad='zero' or 'repeat' to use short ones")
            )
        plan = box["plan"] = plan_clips(view, spec, pick(view, total), keys)
        return {k: (k, plan.rows[k]) for k in keys}

    got = gather(fn)
    plan = box["plan"]
    out = finish_clips(plan, got, spec)
    if spec.pad:
        out["is_pad"] = plan.is_pad
    return out


def gather_nstep(
    gather: Gather, spec: NStepSpec, stored: list[str], pick: Pick, keys: list[str] | None = None
) -> dict[str, np.ndarray]:
    """n-step transitions: data ``keys`` (default all ``stored`` keys) at ``t`` (stacked
    for observations if ``frame_stack``), ``next_obs`` (mirroring the observation key or
    group), ``return``, ``discount`` (gamma^steps, 0 when the window ends in a
    termination), ``n_steps`` and ``terminated_n``.  Reward, observation and stored next
    columns are found among all ``stored`` keys, whatever ``keys`` asks for."""
    reward, obs_root, obs, nxt = spec.resolve(stored)
    # stored one-step next observations are replaced by the n-step ones: not gathered
    replaced = {next_name(obs_root, k) for k in obs}
    keys = [k for k in (stored if keys is None else keys) if k not in replaced]
    box = {}

    def fn(view: EpisodeView) -> dict:
        total = num_nstep(view, bool(nxt))
        if total == 0:
            raise EmptyBufferError("no transitions to sample (the buffer holds no usable steps)")
        plan = box["plan"] = plan_nstep(view, spec, pick(view, total), keys, reward, obs, nxt)
        return plan.requests

    got = gather(fn)
    return finish_nstep(box["plan"], got, spec, obs_root)


class EngineEpisodes:
    """Episode access shared by the facades over a writable engine (``self._engine``):
    the gather, keys and episode view the sampling functions and dumps use."""

    def _gather(self, fn, alloc=None) -> dict[str, np.ndarray]:
        return self._engine.draw_and_gather(lambda index: fn(index.episodes()), alloc=alloc)[1]

    def _keys(self) -> list[str]:
        schema = self._engine.schema
        return [] if schema is None else list(schema.keys)

    def _view(self) -> EpisodeView:
        return self._engine.index.episodes()

    @property
    def num_episodes(self) -> int:
        """Episodes (whole or partly) in the visible data."""
        return len(self._view())

    def episode_table(self) -> dict[str, np.ndarray]:
        """Per-episode columns (id, length, first_step, terminated, truncated)."""
        return episode_table(self._view())


def episode_table(view: EpisodeView) -> dict[str, np.ndarray]:
    """Per-episode columns of the visible episodes, oldest first."""
    return {
        "episode": view.ids.copy(),
        "length": view.length.copy(),
        "first_step": view.first_step.copy(),
        "terminated": view.terminated.copy(),
        "truncated": view.truncated.copy(),
    }


def gather_episode(gather: Gather, keys: list[str], e: int) -> dict[str, np.ndarray]:
    """Every visible step of episode ``e`` (``-len <= e < len``) as ``[L, ...]`` arrays."""

    def fn(view: EpisodeView) -> dict:
        n = len(view)
        if not -n <= e < n:
            raise IndexError(f"episode {e} out of range for {n} episodes")
        ep = e % n
        rows = view.rows(np.full(int(view.length[ep]), ep), np.arange(int(view.length[ep])))
        return {k: (k, rows) for k in keys}

    return gather(fn)


def as_nested(flat: Mapping[str, np.ndarray]) -> dict:
    from .schema import unflatten

    return unflatten(dict(flat))
