"""Every facade shares one lifecycle: a buffer the program drops (and the garbage
collector frees) commits what it holds and releases its writer lock, so running a
notebook cell again after ``del buf`` (or reassigning the name) reopens the path."""

from __future__ import annotations

import gc

import numpy as np
import torch
from conftest import make_traj

import zreplay


def _gone(make, reopen, count):
    buf = make()
    del buf
    gc.collect()
    again = reopen()  # raised WriterLockedError for two of the three facades
    try:
        assert count(again) == 1
    finally:
        again.close()


def test_a_dropped_trajectory_buffer_commits_and_lets_go(tmp_path):
    path = str(tmp_path / "b")

    def make():
        buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path)
        buf.add_trajectories([make_traj(0)])  # not flushed
        return buf

    _gone(make, lambda: zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path), len)


def test_a_dropped_episode_buffer_commits_and_lets_go(tmp_path):
    path = tmp_path / "b"

    def make():
        rb = zreplay.ReplayBuffer(100, path=path)
        rb.write_episode({"obs": np.zeros((5, 3), np.float32)})
        return rb

    _gone(make, lambda: zreplay.ReplayBuffer(100, path=path), lambda rb: rb.num_episodes)


def test_a_dropped_torchrl_storage_commits_and_lets_go(tmp_path):
    from tensordict import TensorDict
    from torchrl.data import TensorDictReplayBuffer

    from zreplay.torchrl import ZarrStorage

    path = tmp_path / "b"

    def make():
        rb = TensorDictReplayBuffer(storage=ZarrStorage(100, path), batch_size=4)
        rb.extend(TensorDict({"x": torch.ones(10, 3)}, batch_size=[10]))
        return rb

    _gone(make, lambda: ZarrStorage(100, path), lambda s: len(s) // 10)


def test_a_dropped_learner_view_says_it_stopped(tmp_path):
    path = str(tmp_path / "b")
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buf:
        buf.add_trajectories([make_traj(0)])
    view = zreplay.open(path, rate_limiter=zreplay.MinSize(1), learner_id="L")
    view.sample(4)
    del view
    gc.collect()
    from zreplay.store.location import locate
    from zreplay.store.progress import read_progress

    assert read_progress(locate(path), "L").closed
