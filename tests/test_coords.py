"""Row coordinates (zreplay.index.coords): global rows, positions, tagged rows and their
conversions, in one segment and over several with eviction."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import make_traj
from hypothesis import given, settings
from hypothesis import strategies as st

import zreplay
from zreplay.index.coords import (
    SEGMENT_SHIFT,
    RowRange,
    positions_of,
    rows_at,
    tag_rows,
    untag_rows,
)
from zreplay.index.rowspace import RowSpace, SegmentRows, VisibleRows
from zreplay.index.split import split_pieces
from zreplay.index.trajectories import TrajectoryIndex

shapes = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 4)), min_size=1, max_size=20)


def _index(ts, capacity):
    idx = TrajectoryIndex()
    next_ep = 0
    for i, (T, B) in enumerate(ts):
        pieces, _, next_ep = split_pieces({}, T, B, idx.n_rows, next_ep, lanes=None)
        idx.append(T, B, i, 0, b"", pieces)
        if capacity is not None and capacity >= max(t * b for t, b in ts):
            idx.evict_to(capacity)
    return idx


def _space(indexes) -> RowSpace:
    """Segments laid out as a view lays them out: in order, each from where the last
    ended (the construction engine/reader.py uses)."""
    segs, offs, first = [], [], 0
    for key, idx in enumerate(indexes):
        segs.append(VisibleRows(key=key, epoch=idx, low_row=idx.low_row, n_rows=idx.n_rows,
                                first=first, index=idx))  # fmt: skip
        offs.append(positions_of(idx.offsets[idx.low : idx.n], idx.low_row, first))
        first += idx.visible_rows
    bounds = np.concatenate([[0], np.cumsum([i.num_visible for i in indexes])]).astype(np.int64)
    return RowSpace(np.concatenate([*offs, [first]]).astype(np.int64), bounds, segs)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(shapes, st.none() | st.integers(1, 60)), min_size=1, max_size=4))
def test_positions_and_global_rows_round_trip_over_segments_with_eviction(segments):
    indexes = [_index(ts, cap) for ts, cap in segments]
    space = _space(indexes)
    total = sum(i.visible_rows for i in indexes)
    assert space.num_rows == total and space.lo == 0
    seen = []
    for seg, idx in zip(space.segments, indexes, strict=True):
        rows = seg.rows.arange()
        assert len(seg.rows) == idx.visible_rows and seg.rows.start == idx.low_row
        pos = seg.positions(rows)
        # A segment's visible rows are contiguous positions, oldest first ...
        assert np.array_equal(pos, np.arange(seg.first, seg.first + len(rows)))
        # ... and positions name its rows back.
        assert np.array_equal(seg.rows_at(pos), rows)
        # The trajectory a position falls in is the one its global row belongs to.
        if len(rows):
            g = space.trajectory_of(pos) - space.bounds[seg.key]
            assert np.array_equal(g + idx.low, idx.locate(rows))
        seen.append(pos)
    # Every visible row of every segment has its own position, [0, total) in all.
    assert np.array_equal(np.concatenate(seen), np.arange(total))


@given(st.integers(0, 1 << 30), st.integers(0, 1 << 30), st.lists(st.integers(0, 1 << 20)))
def test_positions_of_and_rows_at_are_inverse(start, first, offsets):
    rows = start + np.asarray(offsets, np.int64)
    pos = positions_of(rows, start, first)
    assert np.array_equal(pos - first, rows - start)
    assert np.array_equal(rows_at(pos, start, first), rows)
    assert positions_of(start, start, first) == first


def test_a_writers_positions_are_its_global_rows_unconverted():
    rows = np.arange(5, 9, dtype=np.int64)
    assert rows_at(rows, 5, 5) is rows  # no copy on the writer's sampling path


@given(
    st.lists(st.integers(0, (1 << SEGMENT_SHIFT) - 1), min_size=1, max_size=50),
    st.integers(0, (1 << 16) - 1),
    st.integers(0, 127),
)
def test_tagged_rows_round_trip(rows, key, tag):
    rows = np.asarray(rows, np.int64)
    tagged = tag_rows(rows, key, tag)
    assert tagged.dtype == np.int64 and (tagged >= 0).all()
    keys, tags, back = untag_rows(tagged)
    assert (keys == key).all() and (tags == tag).all() and np.array_equal(back, rows)
    # A writer's first contents: its index is its global rows, as RLinf callers see them.
    assert tag_rows(rows, 0, 0) is rows


def test_row_range_is_a_frozen_value():
    r = RowRange(3, 7)
    assert len(r) == 4 and list(r.arange()) == [3, 4, 5, 6] and r == RowRange(3, 7)
    assert len(RowRange(5, 5)) == 0 and r.arange().dtype == np.int64
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.start = 0


def test_a_views_positions_follow_each_writers_rows_after_eviction(bufpath):
    """Three writers, two of them evicting: a view's positions run over the visible rows
    of each in name order, and the rows read at a writer's positions are that writer's."""
    tids = {"w1": range(0, 6), "w2": range(100, 103), "w3": range(200, 205)}
    caps = {"w1": 60, "w2": None, "w3": 40}
    for wid, ids in tids.items():
        with zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=bufpath, writer_id=wid, capacity=caps[wid]
        ) as buf:
            for t in ids:
                buf.add_trajectories([make_traj(t, T=4, B=5)])
    view = zreplay.open(bufpath)
    ranges = view.segment_rows()
    assert [w for w, _, _ in ranges] == ["w1", "w2", "w3"]
    assert ranges[0][1] > 0 and ranges[2][1] > 0  # w1 and w3 evicted their oldest rows
    got = []
    for wid, lo, hi in ranges:
        rows = np.arange(lo, hi, dtype=np.int64)
        pos = view.positions_of(wid, rows)
        got.append(pos)
        tid = view.rows(pos, keys=["actions"])["actions"][:, 0] // 10000
        assert set(tid.astype(int)) <= set(tids[wid])
        # The oldest visible row of each writer is the first row of a whole trajectory.
        assert int(tid[0]) * 10000 == int(view.rows(pos[:1], keys=["actions"])["actions"][0, 0])
        with pytest.raises(IndexError):
            view.positions_of(wid, [lo - 1] if lo else [hi])
    assert np.array_equal(np.concatenate(got), np.arange(view.num_rows))


def test_classes_renamed_by_role_keep_their_old_names():
    import zreplay.samplers
    import zreplay.samplers.base
    from zreplay.engine.state import SegmentState, WriterState
    from zreplay.store.objectarray import SegmentCache, ShardCache

    assert SegmentRows is zreplay.samplers.base.VisibleRows
    assert zreplay.samplers.SegmentRows is zreplay.samplers.base.SegmentRows is SegmentRows
    assert SegmentState is WriterState and SegmentCache is ShardCache


def test_one_sampler_package_and_its_older_paths():
    """The samplers live in zreplay.samplers; zreplay.sampling.samplers and its modules
    are the same objects under their older names."""
    import importlib

    import zreplay.samplers as new
    import zreplay.sampling.samplers as old

    assert old.Prioritized is new.Prioritized and old.as_sampler is new.as_sampler
    pairs = {"base": "contract", "hook": "hook", "prioritized": "prioritized"}
    pairs |= {"recency": "recency", "staleness": "staleness", "uniform": "uniform"}
    for was, now in pairs.items():
        module = importlib.import_module(f"zreplay.sampling.samplers.{was}")
        assert module is importlib.import_module(f"zreplay.samplers.{now}"), was
        assert getattr(old, was) is module
    from zreplay.sampling.samplers.base import PrioritySampler, Sampler, Units
    from zreplay.sampling.samplers.prioritized import PrioritizedClips
    from zreplay.sampling.samplers.uniform import Window

    assert (Sampler, PrioritySampler, Units) == (
        new.base.Sampler,
        new.base.PrioritySampler,
        new.base.Units,
    )
    assert PrioritizedClips is new.PrioritizedClips and Window is new.Window
    assert new.Prioritized.__module__ == "zreplay.samplers.prioritized"
