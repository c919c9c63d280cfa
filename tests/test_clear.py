"""Clear: what a buffer's clear removes, keeps and never reuses (every facade's clear is
this one)."""

from __future__ import annotations

import os

import builders
import numpy as np
import pytest
from conftest import check_rows, make_traj
from test_all_or_nothing import assert_exactly
from test_all_or_nothing import persistent as unwindowed
from test_rlinf import persistent
from test_swm import fill

import zreplay


def chunk_files(root):
    """Shard files of data arrays (``c.<s>...``) and chunk files of index arrays (``c/``)."""
    return [f for r, _, fs in os.walk(root) for f in fs if "/c/" in r + "/" or f.startswith("c.")]


def test_clear_cache_does_not_break_the_buffer(bufpath):
    with persistent(bufpath, cache_size=100) as buf:
        buf.add_trajectories([make_traj(i) for i in range(3)])
        buf.clear_cache()
        assert buf.get_stats()["cache_size"] == 0
        check_rows(buf.sample(64))  # now from disk
        buf.add_trajectories([make_traj(3)])  # RLinf raises here
        assert len(buf) == 4


def test_clear_removes_data_on_disk(bufpath):
    core = builders.writer(bufpath)
    for tid in range(3):
        builders.add(core, tid)
    core.flush()
    shard_files = chunk_files(bufpath)
    assert any(f.startswith("c.") for f in shard_files)  # data shards among them
    core.engine.clear()
    assert core.num_trajectories == 0 and core.num_rows == 0
    assert chunk_files(bufpath) == []
    assert builders.add(core, 9) == 3  # ids are never reused
    core.close()
    core = builders.writer(bufpath)
    assert core.num_trajectories == 1 and set(builders.tids(core.sample(20)["obs"])) == {9}
    core.close()


def test_clear_reuses_no_row_or_id_and_stale_handles_can_tell(tmp_path):
    from zreplay.samplers import Prioritized

    path = tmp_path / "b"
    buf = unwindowed(path, sampler=Prioritized(alpha=1.0, eps=0.0))
    buf.add_trajectories([make_traj(0), make_traj(1)])
    buf.flush()
    stale_view = zreplay.open(path)
    old = buf.sample(64)["index"]
    buf.clear()
    buf.add_trajectories([make_traj(2), make_traj(3)])  # ids go on
    buf.flush()
    new = buf.sample(512)["index"]
    assert int(new.min()) > int(old.max())  # no row number reused
    assert buf.update_priorities(old, 5.0) == 0  # stale indices apply to nothing
    assert set(buf.priorities(new).tolist()) == {1.0}
    # a view opened before clear(): its stale snapshot still reads whole old rows (or
    # retries); refreshed, it sees only the new trajectories, never old ids on new rows
    check_rows(stale_view.sample(64))
    stale_view.refresh()
    assert {stale_view.trajectory(i)["trajectory_id"] for i in range(2)} == {2, 3}
    check_rows(stale_view.sample(256))
    buf.close()
    assert_exactly(path, [2, 3])


@pytest.fixture
def rb(tmp_path):
    b = zreplay.ReplayBuffer(100, path=tmp_path / "rb", seed=0)
    yield b
    b.close()


def test_clear_keeps_schema_and_refill_works(rb):
    fill(rb, [5, 5])
    rb.clear()
    # stable-worldmodel's order: the first episode's (not sorted)
    assert rb.num_episodes == 0 and rb.column_names == ["pixels", "action", "reward", "terminated"]
    with pytest.raises(ValueError, match="schema mismatch"):
        rb.write_episode({"other": np.zeros(3)})
    fill(rb, [4])
    assert list(rb.lengths) == [4]
