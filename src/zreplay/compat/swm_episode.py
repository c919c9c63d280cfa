"""stable-worldmodel's episodes (``{column: per-step values}``) as columns to add.

An episode is a dict of columns, each a list of per-step arrays (or tensors, or scalars)
or one array with a leading step axis; nested dicts become ``/``-joined key paths.  It is
stored as one trajectory ``[L, 1]`` whose one lane is one episode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core import Prepared
from ..errors import EmptyBufferError, SchemaError, warn_caller
from ..schema import Schema, as_numpy, flatten

# Per-episode (not per-step) data in stable-worldmodel's episodes: not stored.
EPISODE_DATA_KEY = "_episode_data"


def classic_filter(ep: Mapping[str, Any]) -> dict[str, Any]:
    """stable-worldmodel's filter: keep pixels, action, reward, terminated, truncated."""
    keep = ("pixels", "action", "reward", "terminated", "truncated")
    return {k: v for k, v in ep.items() if k in keep}


WRITE = "ReplayBuffer.write_episode: "  # stable-worldmodel's prefix of write errors


def positive(name: str, value) -> None:
    """stable-worldmodel's argument check (before any ``int()``, in its order)."""
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")


def episode_columns(ep: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
    """``({key path: [L, ...] array}, L)``: stable-worldmodel's checks column by column
    in the episode's order (a scalar column, a length differing from the first
    column's), with its messages; nested dicts become ``/`` key paths."""
    cols: dict[str, np.ndarray] = {}
    n = None
    for k, v in flatten(ep).items():
        arr = _per_step(k, v)
        if n is None:
            n = len(arr)
        elif len(arr) != n:
            raise SchemaError(f"{WRITE}column {k!r} has length {len(arr)}, expected {n}")
        cols[k] = arr
    return cols, n or 0


def check_length(n: int, max_steps: int) -> None:
    if n > max_steps:
        raise SchemaError(f"{WRITE}episode length {n} exceeds max_steps={max_steps}")


def check_columns(schema: Schema | None, cols: Mapping[str, np.ndarray]) -> None:
    """``SchemaError`` unless ``cols`` have exactly the schema's keys, per-step shapes and
    dtypes (stable-worldmodel would cast silently)."""
    if schema is None:
        return
    missing = sorted(set(schema.keys) - set(cols))
    extra = sorted(set(cols) - set(schema.keys))
    if missing or extra:
        raise SchemaError(f"{WRITE}schema mismatch. missing={missing}, extra={extra}")
    for k, v in cols.items():
        spec = schema.specs[k]
        if tuple(v.shape[1:]) != tuple(spec.row_shape):
            raise SchemaError(
                f"{WRITE}column {k!r} per-step shape {tuple(v.shape[1:])} mismatches "
                f"expected {tuple(spec.row_shape)}"
            )
        if v.dtype != spec.dtype:
            raise SchemaError(
                f"{WRITE}column {k!r} dtype {v.dtype} mismatches expected {spec.dtype} "
                "(cast it explicitly; stable-worldmodel would silently truncate)"
            )


class UniformClips:
    """stable-worldmodel's default sampler as a hook ``fn(step, buffer, batch_size,
    history_len)``: uniform clip indices, from the buffer's own random generator (what
    ``ReplayBuffer.sampler`` returns by default; wrapping it draws as the default does)."""

    def __call__(self, step: int, buffer, batch_size: int, history_len: int) -> np.ndarray:
        n = buffer.num_valid_ends(history_len)
        if n == 0:
            raise RuntimeError(no_clips(buffer, history_len))
        return buffer.core.stream.rng.integers(0, n, size=batch_size)

    def __repr__(self) -> str:
        return "UniformClips()"


def no_clips(buffer, history_len: int) -> str:
    return (
        f"ReplayBuffer.sample: no clips of history_len={history_len} available "
        f"(num_episodes={buffer.num_episodes}, num_steps_stored={buffer.num_steps_stored})"
    )


def sample_error(e: BaseException, buffer, history_len: int) -> None:
    """Give ``e`` (raised while sampling) stable-worldmodel's text where it has one."""
    text = str(e.args[0]) if e.args else ""
    if isinstance(e, EmptyBufferError) and text.startswith("no clips of"):
        e.args = (no_clips(buffer, history_len),)
    elif isinstance(e, ValueError) and text.startswith("sampler returned shape"):
        e.args = ("ReplayBuffer.sample: " + text,)
    elif isinstance(e, IndexError) and text.startswith("clip index out of range"):
        e.args = ("ReplayBuffer: " + text,)


def as_trajectory(cols: Mapping[str, np.ndarray], n: int) -> Prepared:
    """An episode's ``[L, ...]`` columns as one trajectory ``[L, 1]``: one episode."""
    return Prepared({k: v[:, None] for k, v in cols.items()}, n, 1, split_episodes=False)


def _coerce(value: Any, key: str) -> np.ndarray:
    if type(value).__module__.startswith("torch"):
        return as_numpy(value, key)
    return np.asarray(value)


def _per_step(key: str, value: Any) -> np.ndarray:
    if isinstance(value, (list, tuple)):
        steps = [_coerce(v, key) for v in value]
        shapes = sorted({tuple(s.shape) for s in steps}, key=str)
        if len(shapes) > 1:
            raise SchemaError(
                f"{WRITE}column {key!r}: its steps have shapes {shapes[:4]}; every step of "
                "a column needs the same shape"
            )
        arr = np.stack(steps) if steps else np.zeros((0,))
    else:
        arr = _coerce(value, key)
    if arr.ndim == 0:
        raise SchemaError(f"{WRITE}column {key!r} is scalar; expected a per-step array")
    return np.ascontiguousarray(arr)


def warn_episode_data() -> bool:
    warn_caller("zreplay.ReplayBuffer stores per-step columns only; '_episode_data' was dropped")
    return True


class ReplicaCore:
    """Stands in for the core of a ``ReplayBuffer`` unpickled in a DataLoader worker (which
    reads through a view of the store only)."""

    closed = True

    def __init__(self, path):
        self.path = path

    def __getattr__(self, name):
        raise RuntimeError(
            "this ReplayBuffer is a read-only replica in a DataLoader worker; write "
            "through the original object"
        )
