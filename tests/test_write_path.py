"""The write path: the committer hands TensorStore the RAM tier's rows without a copy, and
zreplay's shard writer (image codecs) encodes a commit's frames on every core.  Neither
may change what reaches the disk, and an add never waits for a frame being encoded
while the staging budget has room."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import zreplay
from zreplay.store import imagecodec

T, B, SIDE = 20, 4, 16  # 80 rows of 16x16x3 frames: 5 chunks of 16 frames each


def _trajectory(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {
        "obs": rng.integers(0, 256, (T, B, SIDE, SIDE, 3), dtype=np.uint8),
        "state": rng.standard_normal((T, B, 5)).astype(np.float32),
        "actions": np.full((T, B, 2), i, np.float32),
    }


def _buffer(path, codec: str, **kw):
    layout = {"obs": {"codec": codec}}
    return zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), layout=layout, **kw
    )


def _check_on_disk(path, n: int) -> None:
    view = zreplay.open(path)
    assert view.num_trajectories == n
    for i in range(n):
        got, want = view.trajectory(i), _trajectory(i)
        for key, arr in want.items():
            np.testing.assert_array_equal(np.asarray(got[key]), arr, err_msg=f"traj {i} {key}")


def test_ring_slots_reused_after_a_commit_never_change_the_disk(tmp_path):
    # No staging and a one-trajectory window: every add reuses the ring slots of the
    # trajectory committed just before, and every commit rewrites the shard that earlier
    # commits began (a shard holds many trajectories).  TensorStore writes straight from
    # the ring; a chunk it kept pointing at reused slots would show up as other rows here.
    buf = _buffer(tmp_path / "b", "zstd", cache_size=1, staging_bytes=0)
    for i in range(24):
        buf.add_trajectories([_trajectory(i)])
    buf.close()
    _check_on_disk(tmp_path / "b", 24)


class _SpiedFrames:
    """``FrameCodec.encode`` wrapped: ``hold`` (an Event) keeps every encode waiting until
    set; ``meet`` makes the first two encodes on the encoder pool wait for each other
    (they only meet if two frames are being encoded at once)."""

    def __init__(self, monkeypatch, hold=None, meet=False):
        self.hold = hold
        self.barrier = threading.Barrier(2, timeout=30) if meet else None
        self.met = False
        self.threads: set[str] = set()
        self._lock = threading.Lock()
        self._waiting = 0
        encode = imagecodec.FrameCodec.encode

        def spied(codec, block):
            name = threading.current_thread().name
            with self._lock:
                self.threads.add(name)
                wait = self.barrier is not None and not self.met and self._waiting < 2
                wait = wait and name.startswith("zreplay-io-encode")
                self._waiting += wait
            if wait:
                self.barrier.wait()
                self.met = True
            if self.hold is not None:
                assert self.hold.wait(60)
            return encode(codec, block)

        monkeypatch.setattr(imagecodec.FrameCodec, "encode", spied)


def test_frames_of_a_commit_are_encoded_on_several_threads_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    spy = _SpiedFrames(monkeypatch, meet=True)
    buf = _buffer(tmp_path / "b", "qoi")
    for i in range(3):
        buf.add_trajectories([_trajectory(i)])
    buf.close()
    assert spy.met, f"frames were encoded one at a time (threads: {sorted(spy.threads)})"
    _check_on_disk(tmp_path / "b", 3)


def test_frames_encoded_in_batches_are_the_bytes_of_one_by_one(tmp_path, monkeypatch):
    # The same rows written by a one-core machine (encoded in place, one after the other)
    # and by a four-core one (batches on the pool): byte-identical shard files.
    trees = {}
    for cores in (1, 4):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        path = tmp_path / f"cores{cores}"
        buf = _buffer(path, "qoi")
        for i in range(3):
            buf.add_trajectories([_trajectory(i)])
        buf.close()
        data = path / "segments" / "default" / "data" / "obs"
        trees[cores] = {p.name: p.read_bytes() for p in sorted(data.iterdir()) if p.is_file()}
    assert trees[1] and trees[1] == trees[4]


@pytest.mark.parametrize("codec", ["qoi", "zstd"])
def test_adds_return_while_frames_wait_to_be_encoded(tmp_path, monkeypatch, codec):
    # Every frame encode is held (image codec: zreplay's encoder; zstd: the whole commit,
    # TensorStore's): adds that fit the staging budget still return, sampleable from RAM.
    hold = threading.Event()
    rows_bytes = T * B * (SIDE * SIDE * 3 + 5 * 4 + 2 * 4 + 8)
    buf = _buffer(tmp_path / "b", codec, cache_size=1, staging_bytes=8 * rows_bytes)
    buf.add_trajectories([_trajectory(0)])
    buf.flush()
    _SpiedFrames(monkeypatch, hold=hold)
    if codec == "zstd":  # TensorStore encodes in C++: hold the committer's write instead
        committer = buf.core.engine._committer
        write = committer._write

        def held(job):
            assert hold.wait(60)
            write(job)

        committer._write = held
    done = []

    def adds():
        for i in range(1, 6):
            buf.add_trajectories([_trajectory(i)])
            done.append(i)

    t = threading.Thread(target=adds, daemon=True)
    t.start()
    t.join(60)
    try:
        assert not t.is_alive() and done == [1, 2, 3, 4, 5]
        assert buf.core.engine.stats()["committed_trajectories"] == 1
        got = np.asarray(buf.sample(400)["actions"][:, 0]).astype(int)
        assert set(np.unique(got)) <= set(range(6)) and got.max() >= 4
    finally:
        hold.set()
    buf.close()
    _check_on_disk(tmp_path / "b", 6)


def test_frames_are_encoded_in_place_once_the_pool_is_shut_down(tmp_path, monkeypatch):
    # At interpreter exit (buffers left open are committed then) no pool takes new work:
    # the frames are encoded on the writer's own thread instead of failing the commit.
    from concurrent.futures import ThreadPoolExecutor

    from zreplay.store import objectarray

    gone = ThreadPoolExecutor(1)
    gone.shutdown()
    monkeypatch.setattr(objectarray, "_ENCODERS", gone)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    buf = _buffer(tmp_path / "b", "qoi")
    for i in range(2):
        buf.add_trajectories([_trajectory(i)])
    buf.close()
    _check_on_disk(tmp_path / "b", 2)


EXIT_SCRIPT = """
import sys, numpy as np, zreplay
path, facade = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
if facade == "swm":
    rb = zreplay.ReplayBuffer(400, path=path)
    for e in range(12):
        rb.write_episode({"pixels": rng.integers(0, 256, (10, 48, 48, 3), dtype=np.uint8),
                          "terminated": np.arange(10) == 9})
else:
    rb = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path)
    for e in range(6):
        rb.add_trajectories([{"obs": rng.integers(0, 256, (10, 2, 24, 24, 3), dtype=np.uint8),
                              "rewards": np.ones((10, 2), np.float32)}])
print("end of script", flush=True)  # left open, unflushed: committed at exit
"""


@pytest.mark.parametrize("facade", ["swm", "rlinf"])
def test_a_buffer_left_open_with_image_rows_is_committed_at_exit(tmp_path, facade):
    """Image keys (the default codec is an image codec, written by zreplay's shard writer)
    in a buffer a script never closes: at exit the writer pool refuses work and the write
    runs inline; it used to deadlock on the array's lock held around the submission."""
    import subprocess
    import sys

    path = tmp_path / "b"
    run = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, str(path), facade],
        capture_output=True,
        text=True,
        timeout=180,  # a hang is the failure (it never ended before the fix)
    )
    assert run.returncode == 0, run.stderr
    view = zreplay.open(path)
    assert view.num_rows == 120 and zreplay.verify(path).ok
