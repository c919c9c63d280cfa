"""What a buffer core hands out besides batches: whole trajectories with their metadata."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.prepared import Prepared
from ..index.trajectories import time_major


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


def read_trajectory(read, keys: list[str], i: int) -> TrajectoryRecord:
    """Visible trajectory ``i`` read through ``read(draw)`` (a core's one gather)."""
    box = {}

    def draw(snap):
        ref = box["ref"] = snap.trajectory(i)
        pos = ref.positions()
        return {k: (k, pos) for k in keys}

    _, flat = read(draw)
    ref = box["ref"]
    meta = ref.metadata()
    T, B = meta["T"], meta["B"]
    columns = {k: time_major(v, T, B) for k, v in flat.items()}
    return TrajectoryRecord(columns, continues=ref.part.index.continues(ref.j), **meta)
