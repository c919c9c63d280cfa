"""stable-worldmodel's ``Dataset`` base-class methods for :class:`zreplay.ReplayBuffer`.

``load_episode`` / ``load_chunk`` (what stable-worldmodel's ``World.evaluate`` from a
dataset and its video helpers call) built on the ``_load_slice`` hook, with its checks
and ``IndexError`` texts; and the four column methods its buffer leaves unimplemented.
Like stable-worldmodel's own ``ReplayBuffer``, slices are numpy, every step, no transform.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class SwmDatasetMethods:
    """Mixed into ``ReplayBuffer``: needs ``num_episodes``, ``lengths``, ``frameskip``,
    ``spec.action_keys``, ``core.episode(e, keys, start, stop)`` and ``_ordered``."""

    def _load_slice(self, ep_idx: int, start: int, end: int) -> dict[str, Any]:
        """Steps ``[start, end)`` of stored episode ``ep_idx`` (oldest = 0) as
        ``{column: [end - start, ...]}`` numpy arrays: every step (no frameskip stride,
        no action reshape, no transform), as stable-worldmodel's buffer."""
        if not 0 <= ep_idx < self.num_episodes:
            raise IndexError(ep_idx)
        return self._ordered(self.core.episode(int(ep_idx), None, int(start), int(end)))

    def load_episode(self, episode_idx: int) -> dict[str, Any]:
        """Every step of stored episode ``episode_idx`` (``[L, ...]`` per column)."""
        return self._load_slice(episode_idx, 0, self.lengths[episode_idx])

    def load_chunk(self, episodes_idx, start, end) -> list[dict[str, Any]]:
        """``_load_slice(e, s, t)`` for each ``(e, s, t)``, its action columns reshaped to
        ``((t - s) // frameskip, -1)`` (stable-worldmodel's ``Dataset.load_chunk``)."""
        chunk = []
        for ep, s, e in zip(episodes_idx, start, end, strict=False):  # swm: plain zip
            steps = self._load_slice(ep, s, e)
            for key in self.spec.action_keys:
                if key in steps:
                    steps[key] = steps[key].reshape((e - s) // self.frameskip, -1)
            chunk.append(steps)
        return chunk

    def get_col_data(self, col: str) -> np.ndarray:
        raise NotImplementedError  # as stable-worldmodel's ReplayBuffer

    def get_row_data(self, row_idx) -> dict:
        raise NotImplementedError

    def get_dim(self, col: str) -> int:
        raise NotImplementedError

    def merge_col(self, source, target: str, dim: int = -1) -> None:
        raise NotImplementedError
