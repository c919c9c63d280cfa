"""What a buffer core hands out besides batches: whole trajectories with their metadata,
and whole trajectories and episodes read in large batches (exports, dumps, copies).

A read is ``read(draw) -> (drawn, {name: array})`` (``BufferCore.read``): ``draw`` runs on
one consistent snapshot and asks for positions; the one gather reads them, a plain range
read per key wherever the rows are contiguous (trajectories always are; episodes of
``[L, 1]`` trajectories too).  Batches hold at most ``batch_bytes`` of rows (at least one
trajectory or episode), so an export of any size streams through bounded memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ..engine.prepared import Prepared
from ..index.trajectories import time_major
from ..numbers import as_positions

BATCH_BYTES = 64 << 20
Read = Callable[[Callable], tuple]


@dataclass
class TrajectoryRecord:
    """One visible trajectory: ``columns`` (flat key path -> ``[T, B, ...]``) and its
    metadata; ``continues`` (bool ``[B]``): lanes whose first step continues an episode
    of the segment's previous trajectory."""

    columns: dict[str, np.ndarray]
    trajectory_id: int
    max_episode_length: int
    model_weights_id: str
    T: int
    B: int
    continues: np.ndarray

    def prepared(self) -> Prepared:
        """This trajectory as an item to add to another buffer (same id and metadata)."""
        return Prepared(
            self.columns,
            self.T,
            self.B,
            self.max_episode_length,
            self.model_weights_id,
            self.trajectory_id,
            continues=self.continues,
        )


def _take(sizes: np.ndarray, row_bytes: int, batch_bytes: int) -> int:
    """How many of the leading ``sizes`` (rows) fit ``batch_bytes`` (at least one)."""
    used = np.cumsum(sizes, dtype=np.int64) * max(1, row_bytes)
    return max(1, int(np.searchsorted(used, batch_bytes, side="right")))


def _row_bytes(schema, keys: list[str]) -> int:
    return max(1, sum(schema.specs[k].row_bytes for k in keys)) if schema and keys else 1


def read_trajectories(
    read: Read, schema, keys: list[str], start: int, stop: int, batch_bytes: int
) -> Iterator[TrajectoryRecord]:
    """Visible trajectories ``[start, stop)`` (``start`` may count from the newest if
    negative, ``stop`` then ``start + 1``) of ``schema``'s ``keys``, oldest first, read a
    batch at a time."""
    row_bytes, i = _row_bytes(schema, keys), start
    while i < stop:
        box: dict = {}

        def draw(snap, i=i, box=box):
            refs, sizes, total = [], [], 0
            for j in range(i, stop):
                ref = snap.trajectory(j)
                n = len(ref.positions())
                if refs and (total + n) * max(1, row_bytes) > batch_bytes:
                    break
                refs.append(ref)
                sizes.append(n)
                total += n
            box["refs"], box["sizes"] = refs, sizes
            pos = np.concatenate([r.positions() for r in refs])
            return {k: (k, pos) for k in keys}

        _, flat = read(draw)
        bounds = np.concatenate([[0], np.cumsum(box["sizes"])])
        for n, ref in enumerate(box["refs"]):
            meta = ref.metadata()
            T, B = meta["T"], meta["B"]
            cols = {k: time_major(v[bounds[n] : bounds[n + 1]], T, B) for k, v in flat.items()}
            yield TrajectoryRecord(cols, continues=ref.part.index.continues(ref.j), **meta)
        i += len(box["refs"])


def read_episodes(
    read: Read, schema, keys: list[str], start: int, batch_bytes: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Visible episodes from ``start`` on that fit ``batch_bytes`` (at least one), from
    one snapshot: ``(columns [total steps, ...], table)`` where ``table`` has per-episode
    ``length``, ``terminated`` and ``truncated`` (episodes follow each other in the
    columns).  ``IndexError`` past the last episode."""
    row_bytes, box = _row_bytes(schema, keys), {}

    def draw(snap):
        view = snap.episodes
        if not 0 <= start < len(view):
            raise IndexError(f"episode {start} out of range for {len(view)} episodes")
        lengths = view.length[start:]
        lengths = lengths[: _take(lengths, row_bytes, batch_bytes)]
        ep = np.repeat(np.arange(start, start + len(lengths)), lengths)
        first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        steps = np.arange(len(ep)) - np.repeat(first, lengths)
        stop = start + len(lengths)
        box["table"] = {
            "length": lengths.copy(),
            "terminated": view.terminated[start:stop].copy(),
            "truncated": view.truncated[start:stop].copy(),
        }
        rows = view.rows(ep, steps)
        return {k: (k, rows) for k in keys}

    _, cols = read(draw)
    return cols, box["table"]


def read_rows(read: Read, keys: list[str], positions) -> dict[str, np.ndarray]:
    """Rows at visible positions ``[0, num_rows)`` (a writer's as a view's) of ``keys``,
    read through ``read(draw)``.  ``positions`` as numpy indexes the visible rows
    (:func:`~zreplay.numbers.as_positions`: negative from the end, or a boolean mask of
    one entry per row); IndexError outside them, TypeError for floats."""

    def draw(snap):
        pos = as_positions(positions, snap.num_rows, "row positions")
        return {k: (k, pos) for k in keys}

    return read(draw)[1]


def read_global_rows(read: Read, keys: list[str], rows) -> dict[str, np.ndarray]:
    """Rows of a one-segment snapshot (a writer's) at its global ``rows`` (int64, any
    shape, read flat), located in the same snapshot the rows are read from, so an
    eviction cannot come between; IndexError for a row not visible in it."""
    rows = np.asarray(rows, np.int64).reshape(-1)

    def draw(snap):
        pos = snap.parts[0].positions(rows)
        return {k: (k, pos) for k in keys}

    return read(draw)[1]
