"""zreplay.open(): a read-only, dataset-like view; plain zarr can read everything."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zarr
from conftest import check_rows, make_traj, traj_equal

import zreplay


@pytest.fixture
def written(bufpath):
    trajs = [make_traj(i, T=3 + i, B=2) for i in range(4)]
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath) as buf:
        buf.add_trajectories(trajs)
    return bufpath, trajs


def test_view_basics(written):
    path, trajs = written
    v = zreplay.open(path, seed=0)
    assert v.num_trajectories == 4 and v.num_rows == sum((3 + i) * 2 for i in range(4))
    assert "curr_obs/main_images" in v.keys() and len(v) == v.num_rows
    s = v.sample(50)
    assert isinstance(s["actions"], np.ndarray) and s["curr_obs"]["main_images"].dtype == np.uint8
    check_rows(s)
    for i, t in enumerate(trajs):
        traj_equal(v.trajectory(i), t)
    assert v[0]["actions"].shape == (6,)
    with pytest.raises(IndexError):
        v.trajectory(4)


def test_refresh_sees_commits_from_another_process(written):
    path, _ = written
    v = zreplay.open(path)
    code = textwrap.dedent(
        f"""
        import sys; sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from conftest import make_traj
        import zreplay
        with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path={path!r}) as b:
            b.add_trajectories([make_traj(i) for i in range(4, 7)])
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert v.num_trajectories == 4
    assert v.refresh() is True
    assert v.num_trajectories == 7 and v.trajectory(6)["trajectory_id"] == 6
    assert v.refresh() is False


def test_view_of_empty_and_non_buffer(tmp_path):
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "e")):
        pass
    v = zreplay.open(tmp_path / "e")
    assert v.num_rows == 0 and v.keys() == []
    with pytest.raises(zreplay.EmptyBufferError):
        v.sample(1)
    with pytest.raises(zreplay.FormatError):
        zreplay.open(tmp_path)


def test_plain_zarr_reads_every_trajectory(written):
    """The recipe of FORMAT.md, with zarr and json only."""
    path, trajs = written
    root = zarr.open_group(path, mode="r")
    schema = root.attrs["zreplay"]["schema"]
    seg = root["segments/default"]
    commit = json.loads(open(f"{path}/segments/default/zreplay/commit.json").read())
    off = seg["offsets"][: commit["n_traj"] + 1]
    T_col, B_col = seg["traj/T"][: commit["n_traj"]], seg["traj/B"][: commit["n_traj"]]
    for i in range(commit["low_traj"], commit["n_traj"]):
        T, B = int(T_col[i]), int(B_col[i])
        got = {}
        for key in schema:
            rows = seg[f"data/{key}"][off[i] : off[i + 1]]  # env-major: [B*T, ...]
            got[key] = rows.reshape(B, T, *rows.shape[1:]).swapaxes(0, 1)
        traj_equal(zreplay.schema.unflatten(got), trajs[i])
    assert seg["traj/trajectory_id"][: commit["n_traj"]].tolist() == [0, 1, 2, 3]
    wid = bytes(seg["traj/model_weights_id"][0]).rstrip(b"\0").decode()
    assert wid == zreplay.open(path).trajectory(0)["model_weights_id"]


def test_zarr_fallback_reads_never_fail_while_the_writer_replaces_shards(tmp_path):
    """Forked readers use zarr-python, which opens a shard twice per read (index, chunk):
    a read straddling the writer's atomic shard replacement is retried, never an error."""
    import threading
    import time

    from zreplay.store import arrays as Z

    rb = zreplay.ReplayBuffer(100_000, path=tmp_path / "s", durable=False)

    def ep(i):
        return {
            "pixels": np.full((5, 8, 8), i % 250, np.uint8),
            "reward": np.full(5, i, np.float32),
        }

    rb.write_episode(ep(0))
    rb.flush()
    stop = threading.Event()

    def writer():
        i = 1
        while not stop.is_set():
            rb.write_episode(ep(i))
            rb.flush()
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    arr = Z.ZarrArray(rb.path / "segments" / "default" / "data" / "pixels")
    reads, t0 = 0, time.monotonic()
    try:
        while time.monotonic() - t0 < 3:
            assert (Z.ZarrIO(arr._arr, np.arange(5)).read().result() == 0).all()
            reads += 1
    finally:
        stop.set()
        t.join()
        rb.close()
    assert reads > 50


def test_views_and_clip_datasets_keep_rlinf_actions_dense_under_frameskip(bufpath):
    """The buffer, its view and ClipDataset agree: "actions" (RLinf's name) is an action
    column, kept dense between strided frames (adversarial pass)."""
    b = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath, seed=0)
    b.add_trajectories(
        [
            {
                "actions": np.arange(40, dtype=np.float32).reshape(10, 1, 4),
                "rewards": np.zeros((10, 1), np.float32),
            }
        ]
    )
    own = b.sample_clips(2, history_len=2, frameskip=3)["actions"]
    b.close()
    view = zreplay.open(bufpath, seed=0).sample_clips(2, history_len=2, frameskip=3)["actions"]
    item = zreplay.ClipDataset(bufpath, history_len=2, frameskip=3)[0]["actions"]
    assert tuple(own.shape) == (2, 2, 3 * 4)
    assert tuple(view.shape) == tuple(own.shape) and tuple(item.shape) == (2, 3 * 4)
    assert np.asarray(item)[0].tolist() == list(range(12))  # three steps' actions in a row
