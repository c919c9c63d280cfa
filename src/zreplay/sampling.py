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
from .errors import EmptyBufferError, SchemaError
from .nstep import NStepSpec, finish_nstep, next_name, nstep_counts, plan_nstep
from .samplers.base import Units

Gather = Callable[[Callable[[EpisodeView], dict]], dict]
# pick(units) -> flat unit indices, or (flat indices, extra outputs such as index/weight)
Pick = Callable[[Units], object]


def group_requests(requests: Mapping[str, tuple[str, np.ndarray]]) -> list[tuple]:
    """Requests that share one rows array (by identity): ``[(rows, [(name, key), ...])]``,
    so a source locates and reads those rows once for all their keys."""
    groups: dict[int, tuple] = {}
    for name, (key, rows) in requests.items():
        groups.setdefault(id(rows), (rows, []))[1].append((name, key))
    return list(groups.values())


def clip_units(view: EpisodeView, spec: ClipSpec) -> Units:
    """The clips of ``spec`` over ``view`` as sampling units (keyed by start row)."""
    key = ("clip", spec.span, spec.pad_left)
    counts = view.cached(("counts", *key), lambda: spec.counts(view))
    return Units(view, counts, spec.cumulative(view), spec.pad_left, spec.history_len, "clip")


def nstep_units(view: EpisodeView, has_next: bool) -> Units:
    """The n-step transitions over ``view`` as sampling units (keyed by their step's row)."""
    counts = view.cached(("counts", "nstep", has_next), lambda: nstep_counts(view, has_next))
    cum = view.cumulative(("nstep", has_next), lambda: counts)
    return Units(view, counts, cum, 0, 1, "transition")


def uniform(rng: np.random.Generator, n: int) -> Pick:
    """Pick ``n`` units uniformly with replacement."""
    return lambda units: rng.integers(0, units.total, size=n)


def fixed(indices) -> Pick:
    """Pick the given flat unit indices (checked against the unit count at gather time)."""
    idx = np.asarray(indices, np.int64).reshape(-1)

    def pick(units: Units) -> np.ndarray:
        if len(idx) and (idx.min() < 0 or idx.max() >= units.total):
            raise IndexError(f"{units.name} index out of range [0, {units.total})")
        return idx

    return pick


def _picked(pick: Pick, units: Units, box: dict) -> np.ndarray:
    got = pick(units)
    flat, box["extra"] = got if isinstance(got, tuple) else (got, {})
    return np.asarray(flat, np.int64)


def add_extra(out: dict, extra: Mapping[str, np.ndarray]) -> dict:
    """Put a sampler's outputs (``index``, ``weight``) beside the data keys of a batch."""
    for name, arr in extra.items():
        if name in out:
            raise SchemaError(
                f"the buffer stores a key {name!r}, which clashes with the sampler's "
                f"{name!r} output; rename that key to use a prioritized sampler"
            )
        out[name] = arr
    return out


def gather_clips(
    gather: Gather, spec: ClipSpec, keys: list[str], pick: Pick
) -> dict[str, np.ndarray]:
    """Clips ``{key: [n, history_len, ...]}`` (plus ``is_pad`` when padding is on)."""
    box = {}

    def fn(view: EpisodeView) -> dict:
        units = clip_units(view, spec)
        if units.total == 0:
            raise EmptyBufferError(
                f"no clips of history_len={spec.history_len} (frameskip={spec.frameskip}): "
                f"{len(view)} stored episode(s), none long enough"
                + ("" if spec.pad else "; pass pad='zero' or 'repeat' to use short ones")
            )
        plan = box["plan"] = plan_clips(view, spec, _picked(pick, units, box), keys)
        return {k: (k, plan.rows[k]) for k in keys}

    got = gather(fn)
    plan = box["plan"]
    out = finish_clips(plan, got, spec)
    if spec.pad:
        out["is_pad"] = plan.is_pad
    return add_extra(out, box["extra"])


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
        units = nstep_units(view, bool(nxt))
        if units.total == 0:
            raise EmptyBufferError("no transitions to sample (the buffer holds no usable steps)")
        flat = _picked(pick, units, box)
        plan = box["plan"] = plan_nstep(view, spec, flat, keys, reward, obs, nxt)
        return plan.requests

    got = gather(fn)
    return add_extra(finish_nstep(box["plan"], got, spec, obs_root), box["extra"])


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
