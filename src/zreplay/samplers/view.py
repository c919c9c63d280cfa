"""The sampler plumbing of :class:`~zreplay.BufferView`: its visible rows as a row space
(one :class:`SegmentRows` per writer's segment, priorities read from what each writer
saved), draw contexts, and in-process priority updates."""

from __future__ import annotations

import numpy as np

from .base import Context, RowSpace, SegmentRows
from .stored import stored_priorities


class ViewSampling:
    """Mixed into ``BufferView``: uses its ``_order`` (segment states in name order),
    ``_cum_rows``/``_cum_traj`` (row/trajectory position bounds), ``_seg_keys``,
    ``_rows`` (the cached space, reset by each refresh), ``_rng``, ``sampler``, ``step``."""

    def _space(self) -> RowSpace:
        """The visible rows as sampler positions (built once per refresh)."""
        if self._rows is None:
            offs, segs = [], []
            for si, st in enumerate(self._order):
                idx, pos0 = st.index, int(self._cum_rows[si])
                offs.append(idx.offsets[idx.low : idx.n] - idx.low_row + pos0)
                segs.append(
                    SegmentRows(
                        self._seg_keys[st.segment.writer_id],
                        st.epoch,
                        idx.low_row,
                        idx.n_rows,
                        pos0,
                        lambda st=st: stored_priorities(st.segment.dir, st.commit),
                    )
                )
            offsets = np.concatenate([*offs, self._cum_rows[-1:]]).astype(np.int64)
            self._rows = RowSpace(offsets, self._cum_traj.astype(np.int64), segs)
        return self._rows

    def _context(self, step: int | None = None) -> Context:
        if step is None:
            step, self.step = self.step, self.step + 1
        return Context(self._rng, self._space(), step, self)

    def _pick(self, n: int):
        if int(n) <= 0:
            raise ValueError(f"the number of samples must be > 0, got {n}")
        step, self.step = self.step, self.step + 1
        return lambda units: self.sampler.draw_units(self._context(step), units, int(n))

    def update_priorities(self, indices, priorities) -> int:
        """Set the priorities of what a batch drew (``batch["index"]``) in this view's
        sampler (this process only; the store is never written); returns how many were
        applied.  Needs a prioritized sampler (``TypeError`` otherwise)."""
        return self.sampler.update_priorities(self._space(), indices, priorities)

    def priorities(self, indices) -> np.ndarray:
        """Tree leaves (float64) of rows ``indices`` in this view's prioritized sampler."""
        return self.sampler.priorities(self._space(), indices)
