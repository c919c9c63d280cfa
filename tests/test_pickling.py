"""Pickling: a writer crosses a process boundary one way (as a read-only view of what it
committed), and a ReplayBuffer's pickled form reaches its workers whatever its sampler
and store (TorchRL's pickled storages: test_torchrl_forms.py; views and buffers in Ray:
test_ray.py)."""

from __future__ import annotations

import numpy as np
import pytest

import zreplay
from zreplay import TrajectoryReplayBuffer
from zreplay.samplers.base import Sampler


class _NoConfig(Sampler):
    """A custom sampler whose constructor takes an argument but which keeps the base
    config(): it cannot be rebuilt elsewhere, and a ReplayBuffer's workers never need it."""

    def __init__(self, k):
        self.k = k

    def draw_rows(self, ctx, n):
        return ctx.rng.integers(ctx.space.lo, ctx.space.hi, n), {}

    def draw_units(self, ctx, units, n):
        return ctx.rng.integers(0, units.total, n), {}


def test_a_writer_crosses_a_process_boundary_one_way(tmp_path):
    """Pickled, every facade goes through BufferCore.handoff: what was added is
    committed first and the other side reopens the store read-only, or the pickle is
    refused with a HandoffError (a TypeError) that says what to pass instead."""
    import pickle

    from conftest import make_traj

    from zreplay.errors import HandoffError

    buf = TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "t"))
    buf.add_trajectories([make_traj(0)])  # not flushed: pickling commits it
    view = pickle.loads(pickle.dumps(buf))
    assert type(view).__name__ == "BufferView" and view.num_trajectories == 1
    view.close()
    buf.close()
    with TrajectoryReplayBuffer() as tmp, pytest.raises(HandoffError, match="auto_save_path"):
        pickle.dumps(tmp)
    from zreplay.torchrl import ZarrStorage

    storage = ZarrStorage(10, str(tmp_path / "z"))
    copy = pickle.loads(pickle.dumps(storage))  # a read-only ZarrStorage
    assert type(copy) is ZarrStorage and copy.read_only and not storage.read_only
    copy.close()
    storage.close()
    with pytest.raises(HandoffError, match="path="):
        pickle.dumps(ZarrStorage(10))  # a private temporary store
    rb = zreplay.ReplayBuffer(100, path=str(tmp_path / "e"))
    rb.write_episode({"obs": np.zeros((5, 2), np.float32), "action": np.zeros((5, 1))})
    replica = pickle.loads(pickle.dumps(rb))  # a DataLoader worker's copy
    assert len(replica) == len(rb) == 5 and replica[0]["obs"].shape == (1, 2)
    with pytest.raises(RuntimeError, match="read-only replica"):
        replica.write_episode({"obs": np.zeros((5, 2), np.float32)})
    rb.close()


def test_a_replay_buffer_pickles_for_its_workers_whatever_its_sampler_and_store(
    tmp_path, shared_location
):
    import pickle

    path, so = shared_location
    rb = zreplay.ReplayBuffer(100, path=path, sampler=_NoConfig(3), storage_options=so)
    rb.write_episode({"obs": np.zeros((5, 2), np.float32), "action": np.zeros((5, 1))})
    replica = pickle.loads(pickle.dumps(rb))  # S3: the replica reaches the store too
    assert len(replica) == 5 and replica[0]["obs"].shape == (1, 2)
    rb.close()
