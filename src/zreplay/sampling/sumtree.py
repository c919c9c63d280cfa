"""A float64 sum tree (with a parallel min tree) for proportional sampling.

:class:`SumTree` is a flat binary tree of float64 node values: node ``1`` is the root,
node ``i`` has children ``2i`` and ``2i + 1``, and leaf ``j`` lives at node ``size + j``
where ``size`` is ``capacity`` rounded up to a power of two (padding leaves hold 0; node
0 is unused).  Invariant: every internal node equals ``left + right`` computed in float64
(and, in the parallel min tree, ``min(left, right)``).  Parents are recomputed from their
children rather than patched by differences, so sums never accumulate drift; the only
rounding left is in the descent of :meth:`SumTree.find`, which is guarded so that a
zero-valued leaf (an evicted row, padding) is never returned.

Prioritized replay on top of it: :mod:`zreplay.sampling.prioritized_state`.
"""

from __future__ import annotations

import numpy as np

from ..errors import EmptyBufferError

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


def check_values(values, n: int, what: str) -> np.ndarray:
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
        self.set_unchecked(idx, check_values(values, idx.size, "leaf values"))

    def set_unchecked(self, idx: np.ndarray, values: np.ndarray) -> None:
        """``update`` without validation, for callers that checked already: ``idx`` int64 in
        range, values finite >= 0."""
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
        v = check_values(v, v.size, "leaf values")
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
        return self._locate_masses(mass)[0]

    def _locate_masses(self, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
        return self.sample_with_values(rng, n, stratified)[0]

    def sample_with_values(
        self, rng: np.random.Generator, n: int, stratified: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`sample`, with the drawn leaves' values (``(leaf int64[n], value float64[n])``)."""
        total = self._sum[1]
        if stratified:
            u = (np.arange(n) + rng.random(n)) * (total / max(n, 1))
        else:
            u = rng.random(n) * total
        return self._locate_masses(u)
