"""Clip, n-step and whole-episode reads, planned over the episodes of a snapshot.

A *read* is ``read(fn) -> (what fn returned, {name: array})`` (an engine's ``read``):
the buffer calls ``fn(snapshot)`` at a consistent instant (under a writer's lock, or on
one refreshed view), where
``snapshot.episodes`` is an :class:`~zreplay.index.episodes.EpisodeView` and
``snapshot.space`` a :class:`~zreplay.index.rowspace.RowSpace`; ``fn`` returns requests
``{name: (key, positions)}``, and the buffer gathers them (:mod:`zreplay.engine.gather`).
Everything here is vectorised: one ``searchsorted`` to locate units, one fancy index (or
one batched disk read) per key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..errors import EmptyBufferError, SchemaError
from ..index.episodes import EpisodeView
from ..numbers import as_positions
from .clips import ClipSpec, finish_clips, plan_clips
from .nstep import NStepSpec, finish_nstep, next_name, nstep_counts, plan_nstep
from .samplers.base import Units

Read = Callable[[Callable[[object], dict]], tuple[object, dict]]
# pick(units, snapshot) -> flat unit indices, or (flat indices, extra outputs: index/weight)
Pick = Callable[[Units, object], object]


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


def fixed(indices) -> Pick:
    """Pick the given flat unit indices, read against the unit count at gather time as
    numpy reads them (:func:`~zreplay.numbers.as_positions`: negative from the end, a
    boolean mask of one entry per unit; floats refused)."""

    def pick(units: Units, _snapshot=None) -> np.ndarray:
        return as_positions(indices, units.total, f"{units.name} indices")

    return pick


def _picked(pick: Pick, units: Units, snapshot, box: dict) -> np.ndarray:
    got = pick(units, snapshot)
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


def gather_clips(read: Read, spec: ClipSpec, keys: list[str], pick: Pick) -> dict[str, np.ndarray]:
    """Clips ``{key: [n, history_len, ...]}`` (plus ``is_pad`` when padding is on)."""
    fn, finish = clip_read(spec, keys, pick)
    return finish(read(fn)[1])


def clip_read(spec: ClipSpec, keys: list[str], pick: Pick) -> tuple[Callable, Callable]:
    """:func:`gather_clips` in two halves, for a caller that reads itself (a sample, kept
    a few calls deep): ``(fn, finish)``, where ``fn(snapshot)`` picks the clips and
    returns their requests, and ``finish(gathered)`` makes the clips of what was read."""
    box = {}

    def fn(snapshot) -> dict:
        view = snapshot.episodes
        units = clip_units(view, spec)
        if units.total == 0:
            raise EmptyBufferError(
                f"no clips of history_len={spec.history_len} (frameskip={spec.frameskip}): "
                f"{len(view)} stored episode(s), none long enough"
                + ("" if spec.pad else "; pass pad='zero' or 'repeat' to use short ones")
            )
        plan = box["plan"] = plan_clips(view, spec, _picked(pick, units, snapshot, box), keys)
        return {k: (k, plan.rows[k]) for k in keys}

    def finish(got: dict) -> dict[str, np.ndarray]:
        plan = box["plan"]
        out = finish_clips(plan, got, spec)
        if spec.pad:
            out["is_pad"] = plan.is_pad
        return add_extra(out, box["extra"])

    return fn, finish


def gather_nstep(
    read: Read, spec: NStepSpec, stored: list[str], pick: Pick, keys: list[str] | None = None
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

    def fn(snapshot) -> dict:
        view = snapshot.episodes
        units = nstep_units(view, bool(nxt))
        if units.total == 0:
            raise EmptyBufferError("no transitions to sample (the buffer holds no usable steps)")
        flat = _picked(pick, units, snapshot, box)
        plan = box["plan"] = plan_nstep(view, spec, flat, keys, reward, obs, nxt)
        return plan.requests

    _, got = read(fn)
    return add_extra(finish_nstep(box["plan"], got, spec, obs_root), box["extra"])


def episode_table(view: EpisodeView) -> dict[str, np.ndarray]:
    """Per-episode columns of the visible episodes, oldest first."""
    return {
        "episode": view.ids.copy(),
        "length": view.length.copy(),
        "first_step": view.first_step.copy(),
        "terminated": view.terminated.copy(),
        "truncated": view.truncated.copy(),
    }


def gather_episode(
    read: Read, keys: list[str], e: int, start: int = 0, stop: int | None = None
) -> dict[str, np.ndarray]:
    """Visible steps ``[start, stop)`` (default all) of episode ``e`` (``-len <= e <
    len``) as ``[stop - start, ...]`` arrays."""

    def fn(snapshot) -> dict:
        view = snapshot.episodes
        n = len(view)
        if not -n <= e < n:
            raise IndexError(f"episode {e} out of range for {n} episodes")
        ep = e % n
        length = int(view.length[ep])
        hi = length if stop is None else int(stop)
        if not 0 <= start <= hi <= length:
            raise IndexError(f"slice [{start}:{hi}] out of episode of length {length}")
        rows = view.rows(np.full(hi - start, ep), np.arange(start, hi))
        return {k: (k, rows) for k in keys}

    return read(fn)[1]
