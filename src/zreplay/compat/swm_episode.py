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
from ..errors import SchemaError
from ..schema import Schema, as_numpy, flatten

# Per-episode (not per-step) data in stable-worldmodel's episodes: not stored.
EPISODE_DATA_KEY = "_episode_data"


def classic_filter(ep: Mapping[str, Any]) -> dict[str, Any]:
    """stable-worldmodel's filter: keep pixels, action, reward, terminated, truncated."""
    keep = ("pixels", "action", "reward", "terminated", "truncated")
    return {k: v for k, v in ep.items() if k in keep}


def episode_columns(ep: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
    """``({key path: [L, ...] array}, L)``; ``SchemaError`` for a scalar column or columns
    of unequal length."""
    cols = {k: _per_step(k, v) for k, v in flatten(ep).items()}
    lengths = {k: len(v) for k, v in cols.items()}
    n = next(iter(lengths.values()))
    for k, ln in lengths.items():
        if ln != n:
            raise SchemaError(f"column {k!r} has length {ln}, expected {n}")
    return cols, n


def check_columns(schema: Schema | None, cols: Mapping[str, np.ndarray]) -> None:
    """``SchemaError`` unless ``cols`` have exactly the schema's keys, per-step shapes and
    dtypes (stable-worldmodel would cast silently)."""
    if schema is None:
        return
    missing = sorted(set(schema.keys) - set(cols))
    extra = sorted(set(cols) - set(schema.keys))
    if missing or extra:
        raise SchemaError(
            f"ReplayBuffer.write_episode: schema mismatch. missing={missing}, extra={extra}"
        )
    for k, v in cols.items():
        spec = schema.specs[k]
        if tuple(v.shape[1:]) != tuple(spec.row_shape):
            raise SchemaError(
                f"column {k!r} per-step shape {tuple(v.shape[1:])} mismatches expected "
                f"{tuple(spec.row_shape)}"
            )
        if v.dtype != spec.dtype:
            raise SchemaError(
                f"column {k!r} dtype {v.dtype} mismatches expected {spec.dtype} (cast it "
                "explicitly; stable-worldmodel would silently truncate)"
            )


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
        arr = np.stack(steps) if steps else np.zeros((0,))
    else:
        arr = _coerce(value, key)
    if arr.ndim == 0:
        raise SchemaError(f"column {key!r} is scalar; expected a per-step array")
    return np.ascontiguousarray(arr)
