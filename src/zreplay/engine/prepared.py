"""A trajectory ready to be added, and the checks a batch passes before anything is written."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import CapacityError, EmptyTrajectoryError, SchemaError
from ..schema import Schema
from ..store.format import WEIGHTS_ID_BYTES
from ..store.memory import physical_memory

PHYSICAL_MEMORY = physical_memory()


@dataclass
class Prepared:
    """A validated trajectory: ``[T, B, ...]`` numpy columns by key path, plus metadata."""

    columns: dict[str, np.ndarray]
    T: int
    B: int
    max_episode_length: int = 0
    model_weights_id: str = ""
    trajectory_id: int | None = None
    # Lanes whose first step continues the episode the same lane of the writer's previous
    # trajectory left open (bool or [B] bools); split_episodes=False: one episode per lane.
    continues: object = False
    split_episodes: bool = True
    weights_bytes: bytes = field(init=False, default=b"")

    def __post_init__(self):
        self.weights_bytes = str(self.model_weights_id).encode("utf-8")
        if len(self.weights_bytes) > WEIGHTS_ID_BYTES:
            raise SchemaError(
                f"model_weights_id {self.model_weights_id!r} is longer than "
                f"{WEIGHTS_ID_BYTES} bytes of UTF-8; use a shorter id (a uuid fits)"
            )

    @property
    def n_rows(self) -> int:
        return self.T * self.B


_INT64 = np.iinfo(np.int64)


def _int64(value, name: str) -> int:
    """``value`` as an int that an int64 column holds, else a SchemaError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SchemaError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if not _INT64.min <= int(value) <= _INT64.max:
        raise SchemaError(f"{name} {value} does not fit in int64; pass a smaller integer")
    return int(value)


def check_batch(
    items: list[Prepared], schema: Schema | None, lanes_b: int | None, capacity: int | None
) -> Schema:
    """Validate a batch against ``schema`` (inferring it from the first item if None):
    keys, dtypes, shapes, ``continues`` lanes (``lanes_b``: environments of the writer's
    previous trajectory), sizes against ``capacity`` rows and this machine's memory.
    Returns the schema; raises a ``ValueError`` subclass on the first problem."""
    for it in items:
        it.max_episode_length = _int64(it.max_episode_length, "max_episode_length")
        if it.trajectory_id is not None:
            it.trajectory_id = _int64(it.trajectory_id, "trajectory_id")
        cont = np.asarray(it.continues, bool)
        if cont.shape not in ((), (it.B,)):
            raise SchemaError(
                f"continues must be a bool or {it.B} bools (one per environment), got "
                f"shape {cont.shape}"
            )
        if cont.any() and lanes_b is not None and lanes_b != it.B:
            raise SchemaError(
                f"continues=True: this trajectory has B={it.B} environments but the "
                f"previous one has {lanes_b}; episodes can only continue lane by lane"
            )
        lanes_b = it.B
        if it.T <= 0 or it.B <= 0:
            raise EmptyTrajectoryError(
                f"trajectory has shape [T={it.T}, B={it.B}]; it must have at least one "
                "step and one environment"
            )
        if schema is None:
            schema = Schema.infer(it.columns)
        schema.check(it.columns, it.T, it.B)
        nbytes = it.n_rows * schema.row_bytes
        if 2 * nbytes > PHYSICAL_MEMORY:
            raise CapacityError(
                f"a trajectory of {it.n_rows} rows (T={it.T} x B={it.B}) holds "
                f"{nbytes / 2**30:.1f} GiB; the writer stages two trajectories in RAM and "
                f"this machine has {PHYSICAL_MEMORY / 2**30:.1f} GiB. Add it in pieces "
                "(shorter T, with continues=True to keep its episodes whole)"
            )
        if capacity is not None and it.n_rows > capacity:
            raise CapacityError(
                f"a trajectory of {it.n_rows} rows (T={it.T} x B={it.B}) exceeds the "
                f"buffer capacity of {capacity} rows; raise capacity or split it"
            )
    return schema
