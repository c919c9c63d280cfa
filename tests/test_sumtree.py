"""SumTree and PrioritizedState: tree invariants, search against brute force, sampling
frequencies (chi-square), importance weights, eviction, and rounding guards."""

from __future__ import annotations

import contextlib
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zreplay.errors import EmptyBufferError
from zreplay.sampling import sumtree
from zreplay.sampling.prioritized_state import PrioritizedState
from zreplay.sampling.sumtree import SumTree


@contextlib.contextmanager
def widths(dense: int | None = None, search: int | None = None):
    """Force the update/search code paths (fancy vs whole-level; descent vs prefix sum)."""
    old = sumtree._DENSE_LEVEL_WIDTH, sumtree._SEARCH_LEVEL_WIDTH
    if dense is not None:
        sumtree._DENSE_LEVEL_WIDTH = dense
    if search is not None:
        sumtree._SEARCH_LEVEL_WIDTH = search
    try:
        yield
    finally:
        sumtree._DENSE_LEVEL_WIDTH, sumtree._SEARCH_LEVEL_WIDTH = old


def assert_tree_invariant(tree: SumTree, leaves: np.ndarray) -> None:
    """Every internal node is exactly left + right (min: min of children, zeros as inf)."""
    size = tree._size
    s, m = tree._sum, tree._min
    assert np.array_equal(s[size : size + tree.capacity], leaves)
    assert not s[size + tree.capacity :].any()  # padding leaves stay 0
    assert np.array_equal(m[size:], np.where(s[size:] > 0, s[size:], np.inf))
    width = size
    while width > 1:
        half = width // 2
        assert np.array_equal(
            s[half:width], s[width : 2 * width : 2] + s[width + 1 : 2 * width : 2]
        )
        assert np.array_equal(
            m[half:width], np.minimum(m[width : 2 * width : 2], m[width + 1 : 2 * width : 2])
        )
        width = half
    assert tree.total == pytest.approx(leaves.sum(), rel=1e-12, abs=0)
    pos = leaves[leaves > 0]
    assert tree.min == (pos.min() if pos.size else np.inf)


def chi2_critical_p001(dof: int) -> float:
    """Upper 0.1% point of chi-square(dof), Wilson-Hilferty (accurate to <0.5% for dof>=30)."""
    z = 3.090232  # standard normal upper 0.1% point
    h = 2.0 / (9.0 * dof)
    return dof * (1.0 - h + z * math.sqrt(h)) ** 3


def chi2_stat(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


# -- SumTree ------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("update"),
            st.lists(st.integers(0, 10_000), min_size=0, max_size=40),
            st.lists(st.sampled_from([0.0, 1e-9, 0.5, 1.0, 3.0, 1e6]), min_size=40, max_size=40),
        ),
        st.tuples(st.just("grow"), st.integers(0, 300), st.just(None)),
    ),
    max_size=25,
)


@pytest.mark.parametrize("dense", [1, 512])
@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 300), seq=ops)
def test_invariant_after_updates_and_grow(dense, capacity, seq):
    with widths(dense=dense):
        tree = SumTree(capacity)
        ref = np.zeros(capacity)
        for op, a, b in seq:
            if op == "update":
                idx = np.array([i % ref.size for i in a], np.int64)
                vals = np.array(b[: idx.size])
                tree.update(idx, vals)
                for i, v in zip(idx, vals, strict=True):  # sequential: last one wins
                    ref[i] = v
            else:
                tree.grow(ref.size + a)
                ref = np.concatenate([ref, np.zeros(a)])
            assert_tree_invariant(tree, ref)
        assert_tree_invariant(pickle.loads(pickle.dumps(tree)), ref)
        assert_tree_invariant(SumTree.from_leaves(tree.to_leaves()), ref)


def test_duplicate_indices_last_wins():
    tree = SumTree(8)
    tree.update(np.array([3, 5, 3, 3, 5]), np.array([1.0, 2.0, 7.0, 4.0, 0.0]))
    assert tree.get([3, 5]).tolist() == [4.0, 0.0]
    assert tree.total == 4.0


def test_bulk_update_matches_rebuild():
    """A batch wider than the tree's levels takes the whole-level path; repeats last-win."""
    rng = np.random.default_rng(3)
    tree = SumTree(10_000)
    idx = rng.integers(0, 10_000, 6000)
    vals = rng.random(6000)
    tree.update(idx, vals)
    ref = np.zeros(10_000)
    for i, v in zip(idx, vals, strict=True):
        ref[i] = v
    assert_tree_invariant(tree, ref)


@pytest.mark.parametrize("search", [1, 16, 1024])
@settings(max_examples=40, deadline=None)
@given(
    leaves=st.lists(
        st.one_of(st.just(0.0), st.floats(1e-6, 1e3)),
        min_size=1,
        max_size=3000,
    ).filter(lambda v: sum(v) > 0),
    seed=st.integers(0, 2**32 - 1),
)
def test_find_matches_cumsum_searchsorted(search, leaves, seed):
    with widths(search=search):
        leaves = np.array(leaves)
        tree = SumTree.from_leaves(leaves)
        cs = np.cumsum(leaves)
        pos = np.flatnonzero(leaves > 0)
        # Midpoints of every positive leaf's interval: no rounding ambiguity.
        mid = cs[pos] - leaves[pos] / 2
        np.testing.assert_array_equal(tree.find(mid), pos)
        # Random masses: the answer is a positive leaf whose interval holds u up to rounding.
        u = np.random.default_rng(seed).random(500) * tree.total
        got = tree.find(u)
        brute = np.searchsorted(cs, u, side="right")
        assert (leaves[got] > 0).all()
        tol = 1e-9 * cs[-1]
        lo = np.where(got > 0, cs[got - 1], 0.0)
        assert ((lo <= u + tol) & (u < cs[got] + tol)).all()
        assert (got == brute).mean() > 0.99
        # Ends: u <= 0 -> first positive leaf; u >= total -> last positive leaf.
        edge = tree.find([-1.0, 0.0, tree.total, np.nextafter(tree.total, 0), 2 * tree.total])
        assert edge.tolist() == [pos[0], pos[0], pos[-1], edge[3], pos[-1]]
        assert leaves[edge[3]] > 0


@pytest.mark.parametrize("search", [1, 16, 1024])
def test_find_exact_on_integer_boundaries(search):
    """Integer leaves make every sum exact: u == a prefix sum must land on the next leaf
    (go right when u >= left), exactly like searchsorted(side="right")."""
    with widths(search=search):
        leaves = np.random.default_rng(4).integers(0, 4, 777).astype(np.float64)
        tree = SumTree.from_leaves(leaves)
        u = np.arange(int(leaves.sum()), dtype=np.float64)
        np.testing.assert_array_equal(
            tree.find(u), np.searchsorted(np.cumsum(leaves), u, side="right")
        )


def test_find_errors():
    with pytest.raises(EmptyBufferError):
        SumTree(4).find([0.5])
    tree = SumTree.from_leaves([1.0, 2.0])
    with pytest.raises(ValueError, match="NaN"):
        tree.find([np.nan])


def test_update_rejects_bad_values():
    tree = SumTree(4)
    for bad in (-1.0, np.nan, np.inf):
        with pytest.raises(ValueError):
            tree.update([1], [bad])
    with pytest.raises(ValueError, match="out of range"):
        tree.update([4], [1.0])
    with pytest.raises(ValueError, match="expected 2"):
        tree.update([0, 1], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="integers"):
        tree.update([0.5], [1.0])
    with pytest.raises(ValueError):
        tree.grow(3)
    assert tree.total == 0.0


def test_tree_sample_frequencies():
    rng = np.random.default_rng(11)
    leaves = rng.uniform(0.2, 5.0, 300)
    leaves[::7] = 0.0
    tree = SumTree.from_leaves(leaves)
    for stratified in (False, True):
        idx = tree.sample(np.random.default_rng(5), 200_000, stratified=stratified)
        counts = np.bincount(idx, minlength=leaves.size)
        assert counts[leaves == 0].sum() == 0
        live = leaves > 0
        stat = chi2_stat(counts[live], leaves[live] / leaves.sum())
        assert stat < chi2_critical_p001(int(live.sum()) - 1)


# -- PrioritizedState ---------------------------------------------------------------


def filled_state(capacity=200, n_rows=450, seed=0, **kw):
    """A state whose ring has wrapped: live rows [n_rows - capacity, n_rows)."""
    rng = np.random.default_rng(seed)
    state = PrioritizedState(capacity, **kw)
    for start in range(0, n_rows, 50):
        state.add(np.arange(start, min(start + 50, n_rows)))
    rows = np.arange(state.low, state.high)
    prios = rng.lognormal(0.0, 1.0, rows.size)
    state.update(rows, prios)
    return state, rows, prios


@pytest.mark.parametrize("stratified", [False, True])
def test_sampling_frequencies_match_priorities(stratified):
    state, rows, prios = filled_state(alpha=0.6, eps=1e-3)
    assert (state.low, state.high) == (250, 450)
    p = (prios + 1e-3) ** 0.6
    p /= p.sum()
    got, _ = state.sample(np.random.default_rng(42), 200_000, stratified=stratified)
    assert got.min() >= state.low and got.max() < state.high
    counts = np.bincount(got - state.low, minlength=rows.size)
    assert chi2_stat(counts, p) < chi2_critical_p001(rows.size - 1)
    # The same statistic rejects the distribution without alpha (the test can fail).
    wrong = prios / prios.sum()
    assert chi2_stat(counts, wrong) > chi2_critical_p001(rows.size - 1)


def test_importance_weights_match_direct_computation():
    state, rows, prios = filled_state(alpha=0.7, beta=0.5, eps=1e-4)
    got, w = state.sample(np.random.default_rng(1), 1000, beta=0.5)
    leaf = (prios + 1e-4) ** 0.7
    P = leaf / leaf.sum()
    N = rows.size
    w_all = (N * P) ** -0.5
    expected = w_all[got - state.low] / w_all.max()
    np.testing.assert_allclose(w, expected, rtol=1e-12)
    assert w.max() <= 1.0
    # beta = 0: every weight is 1.
    assert (state.sample(np.random.default_rng(1), 10, beta=0.0)[1] == 1.0).all()


def test_beta_annealing():
    state = PrioritizedState(10, beta=0.4, beta_steps=100)
    assert state.beta_at(0) == 0.4
    assert state.beta_at(50) == pytest.approx(0.7)
    assert state.beta_at(100) == 1.0 and state.beta_at(10**6) == 1.0
    assert PrioritizedState(10, beta=0.4).beta_at(10**6) == 0.4
    state.add(np.arange(10))
    state.update(np.arange(10), np.arange(1.0, 11.0))
    rng = np.random.default_rng(0)
    _, w0 = state.sample(rng, 64)  # call 0: beta 0.4
    state.sample_calls = 100
    rows, w1 = state.sample(rng, 64)  # call 100: beta 1
    leaf = state.leaf_value(np.arange(1.0, 11.0))
    np.testing.assert_allclose(w1, (leaf[rows] / leaf.min()) ** -1.0, rtol=1e-12)
    assert state.sample_calls == 101


def test_new_rows_get_max_priority():
    state = PrioritizedState(100, alpha=0.5, eps=0.0, initial_priority=2.0)
    state.add(np.arange(10))
    np.testing.assert_allclose(state.tree.get(np.arange(10)), 2.0**0.5)
    state.update([3], [9.0])
    state.update([4], [1.0])  # lower priorities never lower max_priority
    state.add(np.arange(10, 12))
    np.testing.assert_allclose(state.tree.get([10, 11]), 3.0)
    state.add(np.arange(12, 14), priorities=[16.0, 0.5])
    np.testing.assert_allclose(state.tree.get([12, 13]), [4.0, 0.5**0.5])
    assert state.max_priority == 16.0


def test_stale_updates_ignored_after_eviction():
    state = PrioritizedState(10, alpha=1.0, eps=0.0)
    state.add(np.arange(10))
    rows, _ = state.sample(np.random.default_rng(0), 32)
    state.evict_below(5)
    assert state.tree.get(np.arange(5)).tolist() == [0.0] * 5
    state.add(np.arange(10, 15))  # reuses leaves 0..4
    before = state.tree.to_leaves()
    old = np.arange(5)  # rows sampled before eviction, now stale
    assert state.update(old, np.full(5, 1e9)) == 0
    assert state.update([15, 99], [1e9, 1e9]) == 0  # not yet added
    np.testing.assert_array_equal(state.tree.to_leaves(), before)
    # A mixed batch applies only its live rows.
    assert state.update(np.r_[old, 12], np.r_[np.full(5, 1e9), 7.0]) == 1
    assert state.tree.get([2]).tolist() == [7.0]
    # Adding past capacity evicts implicitly: rows 5..9 leave when 15..19 arrive.
    state.add(np.arange(15, 20))
    assert (state.low, state.high) == (10, 20)
    assert state.update([7], [1e9]) == 0
    rows, _ = state.sample(np.random.default_rng(1), 1000)
    assert rows.min() >= 10 and rows.max() < 20


def test_zero_priority_and_evicted_rows_never_sampled():
    state = PrioritizedState(64, alpha=1.0, eps=0.0)
    state.add(np.arange(100))  # more than capacity at once: live 36..99
    assert (state.low, state.high) == (36, 100)
    prios = np.random.default_rng(2).random(64)
    prios[::3] = 0.0
    state.update(np.arange(36, 100), prios)
    state.evict_below(50)
    rows, w = state.sample(np.random.default_rng(3), 100_000)
    assert rows.min() >= 50
    assert (state.tree.get(rows % 64) > 0).all()
    assert np.isfinite(w).all() and w.max() <= 1.0
    zero_rows = np.arange(36, 100)[prios == 0]
    assert not np.isin(rows, zero_rows).any()


def test_float_drift_never_returns_unused_or_zero_leaf():
    rng = np.random.default_rng(7)
    capacity = 1000  # not a power of two: 24 padding leaves
    state = PrioritizedState(capacity, alpha=1.0, eps=0.0)
    state.add(np.arange(3 * capacity - 100))
    for _ in range(2000):
        rows = rng.integers(state.low, state.high, 64)
        mag = 10.0 ** rng.integers(-12, 12, 64)
        prios = rng.random(64) * mag
        prios[rng.random(64) < 0.3] = 0.0
        state.update(rows, prios)
    state.evict_below(state.low + 137)
    leaves = state.tree.to_leaves()
    for stratified in (False, True):
        rows, _ = state.sample(rng, 50_000, stratified=stratified)
        assert ((rows >= state.low) & (rows < state.high)).all()
        assert (leaves[rows % capacity] > 0).all()
    # Masses at and just below every boundary of the brute-force prefix sums, and the total.
    tree = state.tree
    cs = np.cumsum(leaves)
    u = np.r_[cs, np.nextafter(cs, 0), tree.total, np.nextafter(tree.total, 0)]
    got = tree.find(u)
    assert (got < capacity).all() and (leaves[got] > 0).all()


def test_errors_and_empty():
    state = PrioritizedState(8)
    with pytest.raises(EmptyBufferError):
        state.sample(np.random.default_rng(0), 4)
    state.add(np.arange(4))
    for bad in (-0.5, np.nan, np.inf):
        with pytest.raises(ValueError, match="priorities"):
            state.update([0], [bad])
    with pytest.raises(ValueError, match="consecutive"):
        state.add([5, 6])
    with pytest.raises(ValueError, match="past high"):
        state.evict_below(5)
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedState(8, alpha=-1.0)
    state.evict_below(4)
    with pytest.raises(EmptyBufferError):
        state.sample(np.random.default_rng(0), 4)


def test_state_dict_pickle_and_grow_roundtrip():
    state, rows, prios = filled_state(capacity=100, n_rows=230, beta_steps=50)
    state.sample(np.random.default_rng(0), 8)
    for restored in (
        PrioritizedState.from_state_dict(state.state_dict()),
        pickle.loads(pickle.dumps(state)),
    ):
        assert (restored.low, restored.high, restored.sample_calls) == (130, 230, 1)
        a = state.sample(np.random.default_rng(9), 100)
        b = restored.sample(np.random.default_rng(9), 100)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        state.sample_calls -= 1
    before = state.tree.get(rows % 100)
    state.grow(256)
    assert state.capacity == 256
    np.testing.assert_array_equal(state.tree.get(rows % 256), before)
    assert state.tree.total == pytest.approx(before.sum(), rel=1e-12)
    state.add(np.arange(230, 300))  # more live rows now fit
    assert (state.low, state.high) == (130, 300)


state_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 30)),
        st.tuples(st.just("evict"), st.integers(0, 30)),
        st.tuples(st.just("update"), st.integers(0, 30)),
    ),
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(capacity=st.integers(1, 40), seq=state_ops, seed=st.integers(0, 2**32 - 1))
def test_state_matches_reference_model(capacity, seq, seed):
    """Random add / evict_below / update (stale rows included) against a dict of live
    rows: leaves, [low, high), max_priority, and every drawn row live and positive."""
    rng = np.random.default_rng(seed)
    state = PrioritizedState(capacity, alpha=0.5, eps=0.0)
    live: dict[int, float] = {}  # row -> leaf value
    high, max_p = 0, 1.0
    for op, k in seq:
        if op == "add":
            state.add(np.arange(high, high + k))
            for r in range(high, high + k):
                live[r] = max_p**0.5
            high += k
            live = {r: v for r, v in live.items() if r >= high - capacity}
        elif op == "evict":
            row = min(high, state.low + k)
            state.evict_below(row)
            live = {r: v for r, v in live.items() if r >= row}
        else:
            rows = rng.integers(max(0, state.low - 5), high + 5, k)
            prios = rng.choice([0.0, 0.25, 4.0, 9.0], k)
            applied = state.update(rows, prios)
            assert applied == sum(r in live for r in rows)
            for r, p in zip(rows.tolist(), prios.tolist(), strict=True):
                if r in live:
                    live[r] = p**0.5
                    max_p = max(max_p, p)
        ref = np.zeros(capacity)
        for r, v in live.items():
            ref[r % capacity] = v
        np.testing.assert_allclose(state.tree.to_leaves(), ref, rtol=1e-15)
        assert state.high == high and state.max_priority == max_p
        assert set(live) == set(range(state.low, state.high))
        if any(v > 0 for v in live.values()):
            rows, w = state.sample(rng, 64, stratified=bool(k % 2))
            assert all(live.get(r, 0.0) > 0 for r in rows.tolist())
            assert (w <= 1.0 + 1e-12).all()
        else:
            with pytest.raises(EmptyBufferError):
                state.sample(rng, 4)
