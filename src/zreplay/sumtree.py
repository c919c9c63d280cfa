"""Sum tree and prioritized-replay state over zreplay's global row space.

:class:`SumTree` is a flat binary tree of float64 node values: node ``1`` is the root,
node ``i`` has children ``2i`` and ``2i + 1``, and leaf ``j`` lives at node ``size + j``
where ``size`` is ``capacity`` rounded up to a power of two (padding leaves hold 0; node
0 is unused).  Invariant: every internal node equals ``left + right`` computed in float64
(and, in the parallel min tree, ``min(left, right)``).  Parents are recomputed from their
children rather than patched by differences, so sums never accumulate drift; the only
rounding left is in the descent of :meth:`SumTree.find`, which is guarded so that a
zero-valued leaf (an evicted row, padding) is never returned.

:class:`PrioritizedState` implements proportional prioritized replay (Schaul et al. 2016)
on top of a tree whose leaves are the ring ``row % capacity`` of the live rows
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

from .errors import EmptyBufferError

# find(): the descent starts from a prefix sum over the level holding this many nodes,
# which replaces its top levels by one cumsum + searchsorted.
_SEARCH_LEVEL_WIDTH = 1024
# update(): levels at most this wide (or 4x the batch) are recomputed whole with slices,
# which is cheaper there than gathering and scattering the touched parents.
_DENSE_LEVEL_WIDTH = 512


def _as_leaf_index(leaf_idx, capacity: int) -> np.ndarray:
    idx = np.asarray(leaf_idx)
    if idx.dtype.kind not in "iu":
        raise ValueError(f"leaf indices must be integers, got dtype {idx.dtype}")
    idx = idx.astype(np.int64, copy=False).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= capacity):
        raise ValueError(
            f"leaf index out of range [0, {capacity}): min {idx.min()}, max {idx.max()}"
        )
    return idx


def _check_values(values, n: int, what: str) -> np.ndarray:
    v = np.asarray(values, np.float64).reshape(-1)
    if v.size == 1 and n != 1:
        v = np.full(n, v[0])
    if v.shape != (n,):
        raise ValueError(f"expected {n} {what}, got shape {np.shape(values)}")
    if n and not (np.isfinite(v).all() and v.min() >= 0.0):
        raise ValueError(f"{what} must be finite and >= 0, got min {v.min()}, max {v.max()}")
    return v


class SumTree:
    """Sum and min over ``capacity`` non-negative float64 leaves, with prefix-sum search.

    ``update`` is O(k log capacity) for ``k`` leaves, ``find`` O(n log capacity) for ``n``
    queries, ``total`` and ``min`` O(1).  Pickles as its leaves only (rebuilt on load).
    """

    def __init__(self, capacity: int):
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"SumTree capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._size = 1 << (capacity - 1).bit_length()
        self._sum = np.zeros(2 * self._size, np.float64)
        # Min over *positive* leaves: empty leaves hold +inf so they never set the minimum.
        self._min = np.full(2 * self._size, np.inf, np.float64)
        self._views()

    def _views(self) -> None:
        # Children of nodes i as views: sum[2i] == _sum_even[i], sum[2i+1] == _sum_odd[i].
        self._sum_even, self._sum_odd = self._sum[0::2], self._sum[1::2]
        self._min_even, self._min_odd = self._min[0::2], self._min[1::2]

    # -- reading --------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Number of usable leaves (``0 .. capacity - 1``)."""
        return self._capacity

    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._sum[1])

    @property
    def min(self) -> float:
        """Smallest *positive* leaf value; ``inf`` when every leaf is 0."""
        return float(self._min[1])

    def get(self, leaf_idx) -> np.ndarray:
        """Leaf values ``float64[k]`` of ``leaf_idx: int[k]``."""
        return self._sum[_as_leaf_index(leaf_idx, self._capacity) + self._size]

    def to_leaves(self) -> np.ndarray:
        """A copy of the leaves, ``float64[capacity]`` (what persistence needs)."""
        return self._sum[self._size : self._size + self._capacity].copy()

    # -- writing --------------------------------------------------------------------

    def update(self, leaf_idx, values) -> None:
        """Set leaves ``leaf_idx: int[k]`` to ``values: float64[k]`` (or one scalar).

        Values must be finite and >= 0 (``ValueError`` otherwise).  When an index repeats
        within one call, the *last* occurrence wins, as in a sequential loop.
        """
        idx = _as_leaf_index(leaf_idx, self._capacity)
        self._set(idx, _check_values(values, idx.size, "leaf values"))

    def _set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """``update`` without validation: ``idx`` int64 in range, values finite >= 0."""
        k = idx.size
        if k == 0:
            return
        node = idx + self._size
        s, m = self._sum, self._min
        s[node] = values
        # numpy does not promise which duplicate a fancy assignment keeps; when the
        # written values do not read back, resolve duplicates explicitly (last wins).
        if k > 1 and not np.array_equal(s[node], values):
            rev_first = np.unique(node[::-1], return_index=True)[1]
            keep = k - 1 - rev_first
            node, values = node[keep], values[keep]
            s[node] = values
        m[node] = np.where(values > 0.0, values, np.inf)

        width = self._size  # nodes on the level just written
        dense = max(_DENSE_LEVEL_WIDTH, 4 * k)
        se, so, me, mo = self._sum_even, self._sum_odd, self._min_even, self._min_odd
        while width > dense:  # touched parents only; repeats are harmless (same value)
            node >>= 1
            width >>= 1
            acc = se[node]
            acc += so[node]
            s[node] = acc
            acc = me[node]
            np.minimum(acc, mo[node], out=acc)
            m[node] = acc
        self._rebuild_above(width)

    def _rebuild_above(self, width: int) -> None:
        """Recompute every level above the one holding ``width`` nodes, by slices."""
        s, m = self._sum, self._min
        while width > 1:
            half = width >> 1
            np.add(s[width : 2 * width : 2], s[width + 1 : 2 * width : 2], out=s[half:width])
            np.minimum(m[width : 2 * width : 2], m[width + 1 : 2 * width : 2], out=m[half:width])
            width = half

    @classmethod
    def from_leaves(cls, values) -> SumTree:
        """A tree over ``values: float64[capacity]`` built bottom-up in O(capacity)."""
        v = np.asarray(values, np.float64).reshape(-1)
        tree = cls(max(1, v.size))
        v = _check_values(v, v.size, "leaf values")
        tree._load_leaves(v)
        return tree

    def _load_leaves(self, v: np.ndarray) -> None:
        n, size = v.size, self._size
        self._sum[size : size + n] = v
        self._sum[size + n :] = 0.0
        self._min[size:] = np.inf
        np.copyto(self._min[size : size + n], v, where=v > 0.0)
        self._rebuild_above(size)

    def grow(self, new_capacity: int) -> None:
        """Raise the capacity to ``new_capacity`` keeping every leaf (new leaves are 0)."""
        new_capacity = int(new_capacity)
        if new_capacity < self._capacity:
            raise ValueError(f"grow() cannot shrink a SumTree ({self._capacity} -> {new_capacity})")
        if new_capacity <= self._size:
            self._capacity = new_capacity
            return
        leaves = self.to_leaves()
        self.__init__(new_capacity)
        self._load_leaves(leaves)

    def __getstate__(self) -> dict:
        return {"capacity": self._capacity, "leaves": self.to_leaves()}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["capacity"])
        self._load_leaves(np.asarray(state["leaves"], np.float64))

    # -- search ---------------------------------------------------------------------

    def find(self, u) -> np.ndarray:
        """Leaf index ``int64[n]`` holding each prefix mass ``u: float64[n]``.

        Returns the leaf ``j`` with ``sum(leaves[:j]) <= u < sum(leaves[:j + 1])`` (the
        brute-force ``searchsorted(cumsum(leaves), u, side="right")``) for ``u`` in
        ``[0, total)``; ``u`` below 0 counts as 0 and ``u >= total`` as the last positive
        leaf.  Never returns a zero-valued leaf, hence never an index >= the leaves in
        use.  ``EmptyBufferError`` when ``total == 0``; ``ValueError`` for NaN.
        """
        mass = np.asarray(u, np.float64).reshape(-1)
        if np.isnan(mass).any():
            raise ValueError("find() got NaN prefix masses")
        return self._find(mass)[0]

    def _find(self, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(leaf_idx, leaf_value)`` for prefix masses ``mass: float64[n]`` (not modified)."""
        if not self._sum[1] > 0.0:
            raise EmptyBufferError("cannot search a SumTree whose leaves are all 0")
        s, size = self._sum, self._size
        # Top levels: one prefix sum over the level `width` nodes wide.
        width = min(size, _SEARCH_LEVEL_WIDTH)
        cs = np.cumsum(s[width : 2 * width])
        u = np.maximum(mass, 0.0)
        j = np.searchsorted(cs, u, side="right")
        np.minimum(j, width - 1, out=j)
        u -= np.where(j > 0, cs[j - 1], 0.0)
        node = j + width
        # Remaining levels: go right when u >= left sum.
        while width < size:
            width <<= 1
            node <<= 1
            left = s[node]
            right = u >= left
            left *= right
            u -= left
            node += right
        values = s[node]
        # Rounding can push u past a subtree's mass (u >= total, or a prefix sum that
        # disagrees in the last bit); such a lane ends on a zero leaf and is redone.
        bad = np.flatnonzero(values <= 0.0)
        if bad.size:
            node[bad] = self._guarded_descent(np.maximum(mass[bad], 0.0))
            values = s[node]
        return node - size, values

    def _guarded_descent(self, u: np.ndarray) -> np.ndarray:
        """Root-to-leaf descent that only ever enters positive nodes (returns nodes)."""
        s = self._sum
        node = np.ones(u.size, np.int64)
        while node[0] < self._size:
            left, right = s[2 * node], s[2 * node + 1]
            go_right = (right > 0.0) & ((u >= left) | (left <= 0.0))
            u = np.where(go_right, u - left, u)
            node = 2 * node + go_right
        return node

    def sample(self, rng: np.random.Generator, n: int, stratified: bool = False) -> np.ndarray:
        """``n`` leaf indices ``int64[n]`` drawn with probability ``leaf / total``.

        ``stratified=True`` draws one mass uniformly in each of ``n`` equal slices of
        ``[0, total)`` (lower variance; the result comes out in leaf order).
        """
        return self._sample(rng, n, stratified)[0]

    def _sample(self, rng: np.random.Generator, n: int, stratified: bool):
        total = self._sum[1]
        if stratified:
            u = (np.arange(n) + rng.random(n)) * (total / max(n, 1))
        else:
            u = rng.random(n) * total
        return self._find(u)


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
            p = _check_values(priorities, k, "priorities")
            self.max_priority = max(self.max_priority, float(p.max()))
            values = self.leaf_value(p)
        if k > self.capacity:  # only the last `capacity` rows can be live
            rows, values = rows[-self.capacity :], values[-self.capacity :]
        self.high += k
        self.low = max(self.low, self.high - self.capacity)
        self.tree._set(rows % self.capacity, values)

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
        self.tree._set(gone, np.zeros(gone.size))

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
        leaf, value = self.tree._sample(rng, n, stratified)
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
        p = _check_values(priorities, rows.size, "priorities")
        live = (rows >= self.low) & (rows < self.high)
        if not live.all():
            rows, p = rows[live], p[live]
        if rows.size == 0:
            return 0
        self.max_priority = max(self.max_priority, float(p.max()))
        self.tree._set(rows % self.capacity, self.leaf_value(p))
        return rows.size

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
