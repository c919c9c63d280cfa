"""Eviction: a capacity drops whole oldest trajectories (or episodes), rows are never
reused, and shards wholly below the low-water mark are reclaimed."""

from __future__ import annotations

import builders
import numpy as np
import pytest
from conftest import shard_files
from test_plain_zarr import _shards_below
from test_swm import episode, fill

import zreplay
from zreplay.sampling.clips import ClipSpec
from zreplay.store.commit import read_commit


def test_capacity_evicts_whole_oldest_trajectories(tmp_path):
    core = builders.writer(tmp_path / "b", capacity=40)
    for i in range(10):
        builders.add(core, i)  # [6, 3]: 18 rows each
    assert core.num_trajectories == 2 and core.num_rows == 36
    assert set(builders.tids(core.sample(500)["obs"])) == {8, 9}
    assert core.trajectory(0).trajectory_id == 8
    core.close()
    core = builders.writer(tmp_path / "b", capacity=40)
    assert core.num_trajectories == 2 and core.trajectory(-1).trajectory_id == 9
    core.close()


def test_reopening_with_a_smaller_capacity_evicts_at_once(tmp_path):
    """The rows beyond the new capacity were still sampled until the next add."""
    core = builders.writer(tmp_path / "b")
    for i in range(5):
        builders.add(core, i)  # 90 rows
    core.close()
    core = builders.writer(tmp_path / "b", capacity=40)
    assert core.num_trajectories == 2 and core.num_rows == 36
    assert set(builders.tids(core.sample(256)["obs"])) == {3, 4}
    core.close()
    view = builders.reader(tmp_path / "b")
    assert view.num_trajectories == 2  # and the eviction was committed
    view.close()


def test_eviction_leaves_headless_episodes_that_still_sample(tmp_path):
    B, T = 2, 10
    core = builders.writer(tmp_path / "b", capacity=3 * T * B)
    for i in range(8):  # one endless episode per lane, cut into [T, B] trajectories
        builders.add(core, i, T, B, continues=True)
    tab = core.episode_table()
    assert list(tab["length"]) == [3 * T, 3 * T] and list(tab["first_step"]) == [5 * T] * 2
    code = core.sample_clips(ClipSpec(25), 64)["obs"][..., 0].astype(np.int64)  # [64, 25]
    lane, step = code // 100 % 100, code // 10000 * T + code % 100  # step of the episode
    assert np.all(lane == lane[:, :1]) and np.all(np.diff(step, axis=1) == 1)
    assert step.min() >= 5 * T  # nothing from the evicted head
    core.close()


XY = {"x": (3,), "y": ()}  # a 2-D and a 1-D key


def test_reclaimed_shards_leave_no_empty_directories(tmp_path):
    """Evicted shards of a 2-D key are files c/<s>/0: their directories go with them (a
    leftover c/<s>/ made the kill -9 test's 'no shard below reclaimed_below' flaky)."""
    path = tmp_path / "b"
    lay = {"x": {"chunk_rows": 16, "shard_rows": 64}, "y": {"chunk_rows": 16, "shard_rows": 64}}
    buf = builders.writer(path, capacity=200, layout=lay)
    for i in range(20):
        builders.add(buf, i, T=10, B=5, keys=XY)
    buf.close()
    below = zreplay.store.commit.read_commit(path / "segments" / "default").reclaimed_below
    assert below >= 64 * 10
    for key in ("x", "y"):
        shards = [int(p.name.split(".")[1]) for p in shard_files(path, key)]
        assert shards and shards[0] == below // 64, (key, shards)


def test_reclaim_deletes_every_shard_wholly_below_as_it_goes(tmp_path):
    """Keys with different shard sizes: each commit that reclaims deletes every shard
    wholly below its bound, the one straddling the previous bound included (it stayed
    until the writer's next open)."""
    path = tmp_path / "b"
    lay = {"x": {"chunk_rows": 16, "shard_rows": 16}, "y": {"chunk_rows": 16, "shard_rows": 64}}
    buf = builders.writer(path, capacity=200, layout=lay)
    for i in range(30):
        builders.add(buf, i, T=10, B=5, keys=XY)
        buf.flush()
        below = read_commit(path / "segments" / "default").reclaimed_below
        assert _shards_below(path, "default", below) == [], (i, below)
    assert below >= 1000
    buf.close()


@pytest.fixture
def rb(tmp_path):
    b = zreplay.ReplayBuffer(100, path=tmp_path / "rb", seed=0)
    yield b
    b.close()


def test_fifo_eviction_of_whole_episodes(rb):
    fill(rb, [40, 30, 30])  # exactly 100: no eviction
    assert rb.num_episodes == 3 and rb.num_steps_stored == 100
    rb.write_episode(episode(10, base=9000))  # evicts one
    assert list(rb.lengths) == [30, 30, 10]
    rb.write_episode(episode(90, base=8000))  # evicts many
    assert list(rb.lengths) == [10, 90]
    seen = {int(x) // 1000 for x in rb.sample(500, history_len=1)["pixels"][:, 0, 0, 0]}
    assert seen == {8, 9}  # evicted data never comes back
    assert list(rb.offsets) == [0, 10]


def test_many_wraps_keep_episodes_intact(rb):
    for i in range(60):
        L = 7 + i % 13
        rb.write_episode(episode(L, base=1000 * (i + 1)))
        assert rb.num_steps_stored <= 100
    for ep, L in zip(rb.episodes(), rb.lengths, strict=True):
        pix = np.stack(ep["pixels"])[:, 0, 0]
        assert len(pix) == L and np.all(np.diff(pix) == 1) and pix[0] % 1000 == 0
