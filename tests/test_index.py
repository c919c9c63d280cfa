"""Index arithmetic (offsets, windows, eviction, locate) against brute force."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zreplay.index.split import split_pieces
from zreplay.index.trajectories import TrajectoryIndex

shapes = st.lists(st.tuples(st.integers(1, 7), st.integers(1, 5)), min_size=1, max_size=60)


def build(ts):
    idx = TrajectoryIndex()
    next_ep = 0
    for i, (T, B) in enumerate(ts):
        pieces, _, next_ep = split_pieces({}, T, B, idx.n_rows, next_ep, lanes=None)
        idx.append(T, B, i, 0, b"w", pieces)
    return idx


@given(shapes, st.integers(0, 70))
def test_window_and_locate(ts, window):
    idx = build(ts)
    sizes = [T * B for T, B in ts]
    ends = np.cumsum(sizes)
    assert idx.n_rows == ends[-1] and list(idx.offsets[1:]) == list(ends)
    first = 0 if window == 0 else max(0, len(ts) - window)
    lo, hi = idx.window(window)
    assert (lo, hi) == (int(([0] + list(ends))[first]), int(ends[-1]))
    rows = np.arange(idx.n_rows)
    brute = np.repeat(np.arange(len(ts)), sizes)
    assert np.array_equal(idx.locate(rows), brute)


@settings(max_examples=200)
@given(shapes, st.integers(1, 200))
def test_evict_keeps_newest_whole_trajectories_within_capacity(ts, cap):
    idx = build(ts)
    sizes = [T * B for T, B in ts]
    if max(sizes) > cap:
        return  # the engine refuses such trajectories before they reach the index
    idx.evict_to(cap)
    kept = sizes[idx.low :]
    assert sum(kept) <= cap
    if idx.low > 0:  # keeping one more (older) trajectory would exceed the capacity
        assert sum(sizes[idx.low - 1 :]) > cap
    assert idx.visible_rows == sum(kept) and idx.num_visible == len(kept)
    assert idx.window(0)[0] == idx.low_row


def test_growth_keeps_old_snapshots_valid():
    idx = build([(2, 2)] * 10)
    snap = idx.offsets
    for i in range(100):
        pieces, _, _ = split_pieces({}, 3, 1, idx.n_rows, 100 + i, lanes=None)
        idx.append(3, 1, 10 + i, 0, b"", pieces)
    assert list(snap) == list(range(0, 44, 4))
    assert idx.column("trajectory_id")[-1] == 109 and idx.weights_id(0) == "w"
