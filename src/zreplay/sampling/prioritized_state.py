"""Prioritized-replay state over zreplay's global row space.

:class:`PrioritizedState` implements proportional prioritized replay (Schaul et al. 2016)
on top of a :class:`~zreplay.sampling.sumtree.SumTree` whose leaves are the ring ``row % capacity`` of the live rows
``[low, high)``:

* leaf value = ``(p + eps) ** alpha`` for priority ``p``; new rows enter as if their
  priority were ``max_priority`` (the largest priority ever applied, initially
  ``initial_priority``); evicted rows hold 0 and are never drawn;
* ``P(i) = leaf_i / total``; importance weight ``w_i = (N * P(i)) ** -beta`` with ``N`` the
  number of live rows, divided by the largest possible weight, that of the smallest
  positive leaf (cpprb's and TorchRL's convention), so ``w_i = (leaf_i / min_leaf) ** -beta``
  and weights are <= 1 and comparable across batches.  rlpyt normalises by the batch
  maximum instead; ``weights / weights.max()`` gives that;
* an update for a row evicted since it was sampled (``row < low``) is ignored, so a
  recycled leaf never receives a stale priority (cpprb's ``check_for_update``).

Everything is vectorised numpy: one batch of ``k`` updates or ``n`` draws costs a few
array operations per tree level, never a Python loop per element.
"""

from __future__ import annotations

import numpy as np

from ..errors import EmptyBufferError
from .sumtree import SumTree, check_values


def _as_rows(rows) -> np.ndarray:
    r = np.asarray(rows)
    if r.dtype.kind not in "iu":
        raise ValueError(f"rows must be integers, got dtype {r.dtype}")
    return r.astype(np.int64, copy=False).reshape(-1)


class PrioritizedState:
    """Proportional prioritized replay over global rows ``[low, high)`` (see module doc).

    Rows are the buffer's global, monotonically increasing int64 row ids; row ``r`` owns
    leaf ``r % capacity``.  The owner calls :meth:`add` for new rows, :meth:`evict_below`
    when rows leave the buffer, :meth:`sample` to draw ``(rows, weights)`` and
    :meth:`update` with the new priorities (e.g. ``|TD error|``) of the rows it drew.

    Args:
        capacity: most live rows at once (the ring of leaves).
        alpha: priority exponent; 0 gives uniform sampling, 1 fully proportional.
        beta: importance-sampling exponent at step 0 (``beta0``).
        beta_steps: anneal beta linearly from ``beta`` to 1 over this many steps
            (0: keep it constant); see :meth:`beta_at`.
        eps: added to every priority before ``** alpha`` so that a row whose error is 0
            can still be drawn (0 disables the floor: such rows are never drawn again).
        initial_priority: ``max_priority`` before any update, the priority of new rows.
        start_row: first row id (e.g. the buffer's lowest live row when reopening).
    """

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        beta_steps: int = 0,
        initial_priority: float = 1.0,
        start_row: int = 0,
    ):
        for name, v in (("alpha", alpha), ("beta", beta), ("eps", eps)):
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")
        if not (np.isfinite(initial_priority) and initial_priority > 0):
            raise ValueError(f"initial_priority must be finite and > 0, got {initial_priority}")
        if beta_steps < 0:
            raise ValueError(f"beta_steps must be >= 0, got {beta_steps}")
        self.tree = SumTree(capacity)
        self.alpha, self.beta, self.eps = float(alpha), float(beta), float(eps)
        self.beta_steps = int(beta_steps)
        self.max_priority = float(initial_priority)
        self.low = self.high = int(start_row)
        self.sample_calls = 0

    @property
    def capacity(self) -> int:
        return self.tree.capacity

    @property
    def size(self) -> int:
        """Number of live rows, ``high - low``."""
        return self.high - self.low

    def leaf_value(self, priorities) -> np.ndarray:
        """``(p + eps) ** alpha``, the tree value of priorities ``p: float64[k]``."""
        v = np.asarray(priorities, np.float64) + self.eps
        return v if self.alpha == 1.0 else v**self.alpha

    def beta_at(self, step: int) -> float:
        """Beta at ``step``: linear from ``beta`` (step 0) to 1 (step ``beta_steps``)."""
        if self.beta_steps <= 0:
            return self.beta
        frac = min(1.0, max(0.0, step / self.beta_steps))
        return self.beta + (1.0 - self.beta) * frac

    # -- row space ------------------------------------------------------------------

    def add(self, rows, priorities=None) -> None:
        """Make ``rows: int64[k]`` live: they must continue the row space (``high,
        high + 1, ...``).  Their priority is ``max_priority`` unless ``priorities:
        float64[k]`` is given.  Rows more than ``capacity`` behind the new ``high`` are
        evicted implicitly (their leaves are the ones reused), so adding more than
        ``capacity`` rows at once keeps only the last ``capacity``."""
        rows = _as_rows(rows)
        k = rows.size
        if k == 0:
            return
        if not np.array_equal(rows, np.arange(self.high, self.high + k)):
            raise ValueError(
                f"add() expects consecutive rows starting at high={self.high}, got "
                f"{rows[:4].tolist()}{'...' if k > 4 else ''}"
            )
        if priorities is None:
            values = np.full(k, self.leaf_value(self.max_priority))
        else:
            p = check_values(priorities, k, "priorities")
            values = self._leaves(p)
            self.max_priority = max(self.max_priority, float(p.max()))
        if k > self.capacity:  # only the last `capacity` rows can be live
            rows, values = rows[-self.capacity :], values[-self.capacity :]
        self.high += k
        self.low = max(self.low, self.high - self.capacity)
        self.tree.set_unchecked(rows % self.capacity, values)

    def evict_below(self, row: int) -> None:
        """Evict every live row ``< row``: their leaves become 0 and later updates to them
        are ignored.  ``row`` may not exceed ``high``."""
        row = int(row)
        if row > self.high:
            raise ValueError(f"evict_below({row}) is past high={self.high}")
        if row <= self.low:
            return
        gone = np.arange(self.low, row, dtype=np.int64) % self.capacity
        self.low = row
        self.tree.set_unchecked(gone, np.zeros(gone.size))

    # -- sampling -------------------------------------------------------------------

    def sample(
        self,
        rng: np.random.Generator,
        n: int,
        stratified: bool = False,
        beta: float | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` rows with ``P(i) = leaf_i / total``: ``(rows int64[n], weights
        float64[n])``, weights as in the module doc (max possible weight 1).

        ``beta=None`` uses ``beta_at(sample_calls)`` (annealing over calls to this
        method); pass ``beta=state.beta_at(my_step)`` to anneal over your own clock.
        ``EmptyBufferError`` when no live row has a positive priority.
        """
        if self.high == self.low or not self.tree.total > 0.0:
            raise EmptyBufferError("no live row with a positive priority to sample")
        b = self.beta_at(self.sample_calls) if beta is None else float(beta)
        self.sample_calls += 1
        leaf, value = self.tree.sample_with_values(rng, n, stratified)
        rows = leaf - self.low
        rows %= self.capacity
        rows += self.low
        value /= self.tree.min
        return rows, value**-b

    def update(self, rows, priorities) -> int:
        """Set the priorities of ``rows: int64[k]`` to ``priorities: float64[k]`` (or a
        scalar); returns how many were applied.  Rows evicted since they were sampled
        (``< low``) and rows not yet added (``>= high``) are skipped; repeated rows keep
        the last priority.  ``ValueError`` for NaN, infinite or negative priorities."""
        rows = _as_rows(rows)
        p = check_values(priorities, rows.size, "priorities")
        live = (rows >= self.low) & (rows < self.high)
        if not live.all():
            rows, p = rows[live], p[live]
        if rows.size == 0:
            return 0
        values = self._leaves(p)
        self.max_priority = max(self.max_priority, float(p.max()))
        self.tree.set_unchecked(rows % self.capacity, values)
        return rows.size

    def _leaves(self, p: np.ndarray) -> np.ndarray:
        """Leaves of valid priorities ``p``, refused (``ValueError``, nothing changed)
        when they, or the tree's sum with them, would overflow float64 (a finite
        priority can: ``1e200 ** 2``)."""
        with np.errstate(over="ignore"):  # overflow is refused below, not warned about
            values = self.leaf_value(p)
        if values.size and not (
            np.isfinite(values).all() and np.isfinite(self.tree.total + values.sum())
        ):
            raise ValueError(
                f"priorities up to {float(p.max()):g} give tree leaves (p + eps) ** alpha "
                f"(alpha={self.alpha:g}) that overflow float64; scale the priorities down"
            )
        return values

    # -- capacity and persistence ---------------------------------------------------

    def grow(self, new_capacity: int) -> None:
        """Raise the capacity, remapping live rows to leaves ``row % new_capacity``."""
        new_capacity = int(new_capacity)
        if new_capacity < self.capacity:
            raise ValueError(f"grow() cannot shrink ({self.capacity} -> {new_capacity})")
        live = np.arange(self.low, self.high, dtype=np.int64)
        values = self.tree.get(live % self.capacity)
        leaves = np.zeros(new_capacity)
        leaves[live % new_capacity] = values
        self.tree = SumTree.from_leaves(leaves)

    def state_dict(self) -> dict:
        """Plain scalars plus ``leaves: float64[capacity]``, enough to rebuild exactly."""
        return {
            "capacity": self.capacity,
            "alpha": self.alpha,
            "beta": self.beta,
            "beta_steps": self.beta_steps,
            "eps": self.eps,
            "max_priority": self.max_priority,
            "low": self.low,
            "high": self.high,
            "sample_calls": self.sample_calls,
            "leaves": self.tree.to_leaves(),
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> PrioritizedState:
        """Inverse of :meth:`state_dict` (the tree is rebuilt in O(capacity))."""
        out = cls(
            state["capacity"],
            alpha=state["alpha"],
            beta=state["beta"],
            eps=state["eps"],
            beta_steps=state["beta_steps"],
            initial_priority=state["max_priority"],
            start_row=state["low"],
        )
        out.high = int(state["high"])
        out.sample_calls = int(state["sample_calls"])
        out.tree = SumTree.from_leaves(state["leaves"])
        return out
