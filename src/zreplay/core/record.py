"""A visible trajectory as the core returns it: ``[T, B]`` columns and metadata."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.prepared import Prepared


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
