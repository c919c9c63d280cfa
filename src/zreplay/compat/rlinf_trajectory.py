"""RLinf's ``Trajectory`` and the conversion of any accepted input into validated columns.

Accepted inputs: :class:`Trajectory`, RLinf's own ``Trajectory`` (any object with these
attributes), or a plain dict of ``[T, B, ...]`` numpy arrays / torch tensors with nested
dicts.  ``max_episode_length`` and ``model_weights_id`` are per-trajectory metadata, not
arrays.

The per-epoch bootstrap row: RLinf's producer emits ``dones``, ``terminations``,
``truncations`` and ``prev_values`` with ``T + E`` rows for ``E`` rollout epochs (each epoch
starts with a bootstrap row).  As RLinf documents, the first row of every epoch is dropped,
so these keys line up with ``actions``/``rewards``; unlike RLinf, ``prev_values`` is
aligned too.  Arrays that already have ``T`` rows are kept as they are.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..core import Prepared
from ..errors import SchemaError
from ..schema import as_numpy, flatten

EPOCH_PADDED = ("dones", "terminations", "truncations", "prev_values")
META_FIELDS = ("max_episode_length", "model_weights_id")
# Keys that define T, in RLinf's order of preference.
T_KEYS = ("prev_logprobs", "rewards", "actions")


@dataclass
class Trajectory:
    """One rollout chunk of ``B`` parallel environments over ``T`` chunk steps (RLinf 0.3).

    Every tensor is ``[T, B, ...]``; ``dones``/``terminations``/``truncations`` (and
    ``prev_values``) may carry one extra bootstrap row per rollout epoch.
    """

    max_episode_length: int = 0
    model_weights_id: str = ""
    actions: Any = None
    intervene_flags: Any = None
    rewards: Any = None
    terminations: Any = None
    truncations: Any = None
    dones: Any = None
    prev_logprobs: Any = None
    prev_values: Any = None
    versions: Any = None
    forward_inputs: dict | None = None
    curr_obs: dict | None = None
    next_obs: dict | None = None


RLINF_FIELDS = tuple(f.name for f in fields(Trajectory))
ARRAY_FIELDS = tuple(f for f in RLINF_FIELDS if f not in META_FIELDS)


def rlinf_weights_id(versions: np.ndarray | None) -> str:
    """RLinf's ``model_weights_id``: uuid5 over the hex of ``versions`` (zeros(1) if absent)."""
    raw = np.zeros(1, np.float32) if versions is None else np.ascontiguousarray(versions)
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, raw.tobytes().hex()))


def _as_mapping(traj: Any) -> dict[str, Any]:
    if isinstance(traj, Mapping):
        return dict(traj)
    if all(hasattr(traj, f) for f in ("rewards", "actions", "curr_obs")) or hasattr(
        traj, "__dataclass_fields__"
    ):
        return {f: getattr(traj, f) for f in RLINF_FIELDS if getattr(traj, f, None) is not None}
    raise SchemaError(
        f"cannot add a {type(traj).__name__}: pass a zreplay.Trajectory, an RLinf Trajectory, "
        "or a dict of [T, B, ...] arrays"
    )


def _strip_epoch_rows(key: str, arr: np.ndarray, T: int) -> np.ndarray:
    extra = arr.shape[0] - T
    if extra == 0:
        return arr
    if extra < 0 or T % extra:
        raise SchemaError(
            f"key {key!r}: has {arr.shape[0]} rows but T = {T}; expected T rows or T + E rows "
            "(one bootstrap row per rollout epoch, T divisible by E)"
        )
    per = T // extra
    return arr.reshape(extra, per + 1, *arr.shape[1:])[:, 1:].reshape(T, *arr.shape[1:])


def _check_steps(cols: dict[str, np.ndarray]) -> None:
    """A SchemaError naming the keys whose ``[T, B]`` differ from the rest's (the most
    common ``[T, B]`` of the keys without bootstrap rows), before any key is checked
    against the schema (which would blame whichever key came first)."""
    plain = {
        k: tuple(int(d) for d in a.shape[:2]) for k, a in cols.items() if k not in EPOCH_PADDED
    }
    if len(set(plain.values())) <= 1:
        return
    counts: dict[tuple, int] = {}
    for tb in plain.values():
        counts[tb] = counts.get(tb, 0) + 1
    top = max(counts.values())
    common = [tb for tb, c in counts.items() if c == top]
    fix = (
        "every key needs the same T steps of the same B environments (the flags may add "
        "one bootstrap row per rollout epoch)"
    )
    if len(common) > 1:  # no majority: say what each key has
        each = ", ".join(f"{k!r} [{t}, {b}]" for k, (t, b) in plain.items())
        raise SchemaError(f"the keys of one trajectory disagree on [T, B]: {each}; {fix}")
    t0, b0 = common[0]
    odd = ", ".join(f"{k!r} [{t}, {b}]" for k, (t, b) in plain.items() if (t, b) != (t0, b0))
    raise SchemaError(
        f"the keys of one trajectory disagree on [T, B]: {odd}, while the others have "
        f"[{t0}, {b0}]; {fix}"
    )


def prepare_all(trajectories: Any, continues: Any) -> list[Prepared]:
    """``add_trajectories``' argument (a list of trajectories) prepared; one trajectory
    passed on its own is a SchemaError saying to wrap it in a list."""
    if isinstance(trajectories, Mapping) or hasattr(trajectories, "max_episode_length"):
        raise SchemaError(
            f"add_trajectories takes a list of trajectories, got one "
            f"{type(trajectories).__name__}; wrap it in a list: add_trajectories([traj])"
        )
    items = [prepare(t) for t in trajectories]
    for it in items:
        it.continues = continues
    return items


def prepare(traj: Any) -> Prepared:
    """Turn one accepted input into validated ``[T, B, ...]`` numpy columns (no data copy
    except where epoch bootstrap rows are dropped)."""
    d = {k: v for k, v in _as_mapping(traj).items() if v is not None}
    max_len = d.pop("max_episode_length", 0)
    weights_id = d.pop("model_weights_id", "")
    if not isinstance(max_len, (int, np.integer)):
        raise SchemaError(f"max_episode_length must be an int, got {type(max_len).__name__}")
    if not isinstance(weights_id, str):
        raise SchemaError(f"model_weights_id must be a str, got {type(weights_id).__name__}")
    flat = flatten(d)
    cols = {k: as_numpy(v, k) for k, v in flat.items()}
    for k, a in cols.items():
        if a.ndim < 2:
            raise SchemaError(
                f"key {k!r}: expected an array shaped [T, B, ...], got shape {list(a.shape)}"
            )
    t_key = next((k for k in T_KEYS if k in cols), None)
    if t_key is None:
        plain = [k for k in cols if k not in EPOCH_PADDED]
        t_key = min(plain or cols, key=lambda k: cols[k].shape[0], default=None)
    if t_key is None:
        raise SchemaError("trajectory has no arrays; nothing to add")
    _check_steps(cols)
    T, B = int(cols[t_key].shape[0]), int(cols[t_key].shape[1])
    for k in EPOCH_PADDED:
        if k in cols:
            cols[k] = _strip_epoch_rows(k, cols[k], T)
    if not weights_id:
        weights_id = rlinf_weights_id(cols.get("versions"))
    return Prepared(cols, T, B, int(max_len), weights_id)
