"""Buffers in an S3 bucket, against a real S3 endpoint: moto's server on 127.0.0.1.

Everything goes over HTTP through s3fs and zarr's fsspec store, as it would against AWS
or MinIO: create, append, reopen, sample, refresh from another process, several writer
processes, checkpoint (server-side copies), load into a local buffer, verify.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import uuid

import numpy as np
import pytest
from conftest import check_rows, make_traj, traj_equal

import zreplay
from zreplay.errors import CorruptBufferError, WriterLockedError

moto_server = pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

BUCKET = "zreplay-tests"


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on a free port of 127.0.0.1 and a bucket; stopped at the end."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {"endpoint_url": f"http://{host}:{port}", "key": "testing", "secret": "testing"}
    import s3fs

    s3fs.S3FileSystem(**options).mkdir(BUCKET)
    yield options
    server.stop()


@pytest.fixture
def url(s3):
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/buf"


def _writer(url: str, options: dict, writer_id: str, tids: list[int], q) -> None:
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=options, writer_id=writer_id
    )
    ids = []
    for t in tids:
        buf.add_trajectories([make_traj(t, T=4, B=2)])
        buf.flush()
        ids.append(buf.trajectory(len(buf) - 1)["trajectory_id"])
    buf.close()
    q.put((writer_id, ids))


def test_create_append_reopen_sample_checkpoint(url, s3, tmp_path):
    trajs = [make_traj(t) for t in range(3)]
    buf = zreplay.TrajectoryReplayBuffer(
        seed=0, auto_save=True, auto_save_path=url, storage_options=s3, sample_window_size=0
    )
    buf.add_trajectories(trajs[:2])
    buf.flush()
    check_rows(buf.sample(64))
    buf.close()

    buf = zreplay.TrajectoryReplayBuffer(
        seed=0, auto_save=True, auto_save_path=url, storage_options=s3, enable_cache=False
    )
    assert len(buf) == 2
    buf.add_trajectories(trajs[2:])
    buf.flush()
    for i, want in enumerate(trajs):
        traj_equal(buf.trajectory(i), want)
    check_rows(buf.sample(64))  # every row from the bucket (no RAM tier)

    ckpt = url.rsplit("/", 1)[0] + "/ckpt"
    buf.save_checkpoint(ckpt)
    buf.close()
    view = zreplay.open(ckpt, storage_options=s3)
    assert view.num_trajectories == 3
    traj_equal(view.trajectory(1), trajs[1])

    local = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "l"))
    local.load_checkpoint(ckpt, storage_options=s3)
    assert len(local) == 3
    traj_equal(local.trajectory(2), trajs[2])
    local.close()
    report = zreplay.verify(url, storage_options=s3)
    assert report.ok, report
    assert report.trajectories == 3 and report.rows_checked > 0


def test_writer_processes_share_a_bucket_and_a_reader_refreshes(url, s3):
    view = None
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(url, s3, f"w{i}", list(range(10 * i, 10 * i + 3)), q))
        for i in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    got = dict(q.get(timeout=10) for _ in procs)
    view = zreplay.open(url, storage_options=s3)
    assert view.writer_ids == ["w0", "w1"]
    assert view.num_trajectories == 6
    ids = [view.trajectory(i)["trajectory_id"] for i in range(6)]
    assert sorted(ids) == sorted(got["w0"] + got["w1"])
    assert len(set(ids)) == 6  # unique across writers
    check_rows(view.sample(128))

    # A writer in this process appends; the view sees it only after refresh().
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=s3, writer_id="w2"
    )
    buf.add_trajectories([make_traj(99, T=4, B=2)])
    buf.flush()
    assert view.num_trajectories == 6
    assert view.refresh()
    assert view.num_trajectories == 7
    with pytest.raises(WriterLockedError, match="being written"):
        zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=url, storage_options=s3, writer_id="w2"
        )
    buf.close()


def test_episode_buffer_and_damage_reported(url, s3):
    rb = zreplay.ReplayBuffer(1000, history_len=3, path=url, storage_options=s3, seed=1)
    for e in range(4):
        n = 5 + e
        rb.write_episode(
            {"obs": np.full((n, 2), e, np.float32), "action": np.zeros((n, 1), np.float32)}
        )
    rb.flush()
    clip = rb.sample(8)
    assert clip["obs"].shape == (8, 3, 2)
    # a clip never crosses an episode: all frames of a clip carry the same episode
    assert (clip["obs"][:, :, 0] == clip["obs"][:, :1, 0]).all()
    rb.close()
    rb = zreplay.ReplayBuffer(1000, history_len=3, path=url, storage_options=s3)
    assert rb.num_episodes == 4
    rb.close()
    # DataLoader workers reopen the bucket from the pickled view (URL + storage options).
    from torch.utils.data import DataLoader

    ds = zreplay.ClipDataset(zreplay.open(url, storage_options=s3), history_len=3)
    loader = DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    frames = np.concatenate([b["obs"][:, :, 0].numpy() for b in loader])
    assert len(frames) == len(ds) == sum(5 + e - 2 for e in range(4))
    assert (frames == frames[:, :1]).all()

    # Flip one byte of a stored chunk in the bucket: reads fail loudly, verify names it.
    import s3fs

    fs = s3fs.S3FileSystem(**s3)
    shard = url[len("s3://") :] + "/segments/default/data/obs/c/0/0"
    raw = bytearray(fs.cat_file(shard))
    raw[10] ^= 0xFF
    fs.pipe_file(shard, bytes(raw))
    view = zreplay.open(url, storage_options=s3)
    with pytest.raises(CorruptBufferError, match="'obs'"):
        view.episode(0)
    report = zreplay.verify(url, storage_options=s3)
    assert not report.ok and "'obs'" in report.problems[0]


def test_command_line_reads_a_bucket_through_the_aws_environment(url, s3):
    import json
    import os
    import subprocess
    import sys

    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=url, storage_options=s3)
    buf.add_trajectories([make_traj(0), make_traj(1)])
    buf.close()
    env = dict(
        os.environ,
        AWS_ENDPOINT_URL=s3["endpoint_url"],
        AWS_ACCESS_KEY_ID=s3["key"],
        AWS_SECRET_ACCESS_KEY=s3["secret"],
    )
    run = [sys.executable, "-m", "zreplay.cli"]
    out = subprocess.run([*run, "info", url, "--json"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["trajectories"] == 2 and info["disk_bytes"] > 0
    out = subprocess.run([*run, "verify", url], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr
    missing = url + "-missing"
    out = subprocess.run([*run, "info", missing], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "no such file" in out.stderr


def test_torchrl_storage_in_a_bucket(url, s3):
    """zreplay.torchrl.ZarrStorage on s3:// resumes and checkpoints like a local one."""
    pytest.importorskip("torchrl")
    import torch
    from tensordict import TensorDict
    from torchrl.data import TensorDictReplayBuffer

    from zreplay.torchrl import ZarrStorage

    def rb(path):
        return TensorDictReplayBuffer(
            storage=ZarrStorage(8, path=path, storage_options=s3), batch_size=4
        )

    first = rb(url)
    first.extend(TensorDict({"obs": torch.arange(10.0).view(-1, 1)}, [10]))
    first.storage.close()
    again = rb(url)
    assert again.storage[:]["obs"].flatten().tolist() == [8, 9, 2, 3, 4, 5, 6, 7]
    again.extend(TensorDict({"obs": torch.tensor([[10.0]])}, [1]))
    ckpt = url + "-ckpt"
    again.storage.dumps(ckpt)
    assert again.sample()["obs"].shape == (4, 1)
    again.storage.close()
    loaded = rb(url + "-loaded")
    loaded.storage.loads(ckpt)
    assert loaded.storage[:]["obs"].flatten().tolist() == [8, 9, 10, 3, 4, 5, 6, 7]
    assert len(loaded) == 8
    loaded.extend(TensorDict({"obs": torch.tensor([[11.0]])}, [1]))  # the writer follows
    assert loaded.storage[:]["obs"].flatten().tolist() == [8, 9, 10, 11, 4, 5, 6, 7]
    loaded.storage.close()
