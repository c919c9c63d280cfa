"""A buffer is a plain Zarr hierarchy: zarr walks it without a warning, in every state a
user can meet (several writers, saved priorities, a live writer's lock, a checkpoint, a
killed writer's debris), and buffers written in format 2 are still read and upgraded."""

from __future__ import annotations

import json
import os
import shutil
import warnings

import numpy as np
import zarr
from conftest import check_rows, make_traj

import zreplay
from zreplay.samplers import Prioritized


def walk_without_warnings(path) -> list[str]:
    """Every node name of the hierarchy, with every warning turned into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return sorted(name for name, _ in zarr.open_group(path, mode="r").members(max_depth=None))


def test_zarr_walks_every_kind_of_buffer_without_warnings(tmp_path):
    path = tmp_path / "b"
    a = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), writer_id="a", sampler=Prioritized()
    )
    b = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), writer_id="b")
    a.add_trajectories([make_traj(i) for i in range(3)])
    b.add_trajectories([make_traj(10)])
    a.flush(), b.flush()
    # live writers: locks held, priorities saved, writer numbers claimed
    names = walk_without_warnings(path)
    assert "segments/a/priority/0" in names and "segments/a/zreplay" in names
    a.save_checkpoint(str(tmp_path / "ckpt"))
    assert "segments/a/data/actions" in walk_without_warnings(tmp_path / "ckpt")
    # a killed writer's temp file of a commit in flight sits in the meta node too
    (path / "segments" / "a" / "zreplay" / "commit.json.1.2.tmp").write_text("{")
    walk_without_warnings(path)
    a.close(), b.close()
    walk_without_warnings(path)


def _as_format_2(path) -> None:
    """Move a buffer's own files back where format 2 kept them."""
    root = zarr.open_group(path, mode="r+")
    root.attrs["zreplay"] = {**root.attrs["zreplay"], "format": 2}
    for seg in (path / "segments").iterdir():
        if not seg.is_dir():
            continue
        meta = seg / "zreplay"
        c = json.loads((meta / "commit.json").read_text())
        (seg / "commit.json").write_text(json.dumps({**c, "format": 2}))
        shutil.rmtree(meta)
    os.rename(path / "zreplay" / "writers", path / "writers")
    shutil.rmtree(path / "zreplay")


def test_format_2_buffers_are_read_and_upgraded_by_their_next_writer(tmp_path):
    path = tmp_path / "b"
    for wid in ("a", "b"):
        with zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=str(path), writer_id=wid
        ) as buf:
            buf.add_trajectories([make_traj(i) for i in range(2)])
    before = zreplay.open(path).sample(64, keys=["actions"])
    _as_format_2(path)
    view = zreplay.open(path)  # a reader reads format 2 as it is
    assert view.num_trajectories == 4
    check_rows(view.sample(128))
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), writer_id="a")
    assert len(buf) == 2 and buf.add_trajectories([make_traj(5)])[0] == 2
    buf.flush()
    assert zarr.open_group(path, mode="r").attrs["zreplay"]["format"] == 4
    assert not (path / "segments" / "a" / "commit.json").exists()
    assert (path / "segments" / "a" / "zreplay" / "commit.json").is_file()
    assert sorted(os.listdir(path / "zreplay" / "writers")) == ["0", "1"]  # claims kept
    # segment b is still where format 2 put it until its writer opens it: both are read
    view = zreplay.open(path)
    assert view.num_trajectories == 5 and view.writer_ids == ["a", "b"]
    assert (
        zreplay.open(path).sample(64, keys=["actions"])["actions"].shape == before["actions"].shape
    )
    buf.close()
    zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), writer_id="b").close()
    walk_without_warnings(path)
    assert zreplay.verify(path).ok


def test_reclaimed_shards_leave_no_empty_directories(tmp_path):
    """Evicted shards of a 2-D key are files c/<s>/0: their directories go with them (a
    leftover c/<s>/ made the kill -9 test's 'no shard below reclaimed_below' flaky)."""
    path = tmp_path / "b"
    lay = {"x": {"chunk_rows": 16, "shard_rows": 64}, "y": {"chunk_rows": 16, "shard_rows": 64}}
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), capacity=200, layout=lay, sample_window_size=0
    )
    for _ in range(20):
        buf.add_trajectories([{"x": np.zeros((10, 5, 3), np.float32), "y": np.zeros((10, 5))}])
    buf.close()
    below = zreplay.store.commit.read_commit(path / "segments" / "default").reclaimed_below
    assert below >= 64 * 10
    for key in ("x", "y"):
        shards = sorted(
            int(s) for s in os.listdir(path / "segments" / "default" / "data" / key / "c")
        )
        assert shards and shards[0] == below // 64, (key, shards)
