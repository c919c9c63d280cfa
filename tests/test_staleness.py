"""Staleness: rows whose policy version lags the current one by more than max_staleness
are dropped or down-weighted, through the three entry points; versions from RLinf's
per-step ``versions`` column or from ``model_weights_id``; the current version is passed
at sample time and saved with the buffer; a full buffer drops stale arrivals first."""

from __future__ import annotations

from contextlib import closing

import builders
import numpy as np
import pytest
import torch
from conftest import check_rows, codes_of, make_traj

import zreplay
from zreplay.errors import EmptyBufferError
from zreplay.samplers import Staleness


def np_(x) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def episode(L: int, version: float, base: float) -> dict:
    return {
        "obs": (base + np.arange(L, dtype=np.float32))[:, None],
        "action": np.ones((L, 2), np.float32),
        "reward": np.ones(L, np.float32),
        "versions": np.full((L, 1), version, np.float32),
    }


def filled(entry: str, tmp_path, sampler, n: int = 6):
    """A buffer (or view) holding ``n`` trajectories / episodes, the k-th of version k;
    returns ``(buffer to sample, writer to close)``."""
    if entry == "swm":
        rb = zreplay.ReplayBuffer(10_000, history_len=2, sampler=sampler, seed=0)
        for k in range(n):
            rb.write_episode(episode(10, k, base=100 * k))
        return rb, rb
    w = zreplay.TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=str(tmp_path / "b"),
        seed=0,
        sample_window_size=0,
        sampler=sampler if entry == "rlinf" else None,
    )
    w.add_trajectories([make_traj(k) for k in range(n)])  # versions == k
    w.flush()
    if entry == "rlinf":
        return w, w
    return zreplay.open(tmp_path / "b", seed=0, sampler=sampler), w


def versions_of(entry: str, batch) -> np.ndarray:
    if entry == "swm":
        return np_(batch["obs"])[:, 0, 0] // 100
    return codes_of(batch) // 10000


@pytest.mark.parametrize("entry", ["rlinf", "swm", "view"])
def test_stale_rows_are_never_drawn(tmp_path, entry):
    buf, writer = filled(entry, tmp_path, Staleness(max_staleness=2))
    batch = buf.sample(600, version=5)
    if entry != "swm":
        check_rows(batch)
    assert set(versions_of(entry, batch)) == {3, 4, 5}
    # the current version moves on: the window of fresh versions follows it
    assert set(versions_of(entry, buf.sample(600, version=7))) == {5}
    # clips and n-step transitions: only from fresh rows too (rows of a version newer
    # than the current one count as fresh)
    clips = buf.sample(200, version=4) if entry == "swm" else buf.sample_clips(200, 2, version=4)
    first = np_(clips["obs" if entry == "swm" else "actions"])[:, 0, 0]
    assert set((first // (100 if entry == "swm" else 10000)).astype(int)) == {2, 3, 4, 5}
    if entry == "swm":
        nstep = buf.sample_nstep(200, n=2, version=5)
        assert set((np_(nstep["obs"])[:, 0] // 100).astype(int)) == {3, 4, 5}
    else:
        nstep = buf.sample_nstep(200, n=2, version=5, reward_key="versions")
        assert set((np_(nstep["actions"])[:, 0] // 10000).astype(int)) == {3, 4, 5}
    writer.close()


@pytest.mark.parametrize("entry", ["rlinf", "swm", "view"])
def test_stale_rows_are_down_weighted(tmp_path, entry):
    w = 0.25
    buf, writer = filled(entry, tmp_path, Staleness(max_staleness=1, stale_weight=w), n=4)
    v = np.concatenate([versions_of(entry, buf.sample(1000, version=3)) for _ in range(8)])
    counts = np.bincount(v.astype(int), minlength=4)
    # versions 0, 1 stale (weight w), 2, 3 fresh (weight 1); equal sizes
    share = counts[:2].sum() / counts.sum()
    assert abs(share - 2 * w / (2 * w + 2)) < 0.03, counts
    assert abs(counts[2] / counts[3] - 1) < 0.15
    writer.close()


def test_per_step_versions_inside_one_trajectory():
    """Async rollouts: a trajectory's steps may come from different policy versions."""
    buf = zreplay.TrajectoryReplayBuffer(seed=0, sampler=Staleness(2))
    traj = make_traj(0, T=8, B=2)
    traj.versions = torch.arange(8, dtype=torch.float32)[:, None, None].expand(8, 2, 1).clone()
    buf.add_trajectories([traj])
    t = codes_of(buf.sample(500, version=7)) % 100
    assert set(t) == {5, 6, 7}
    buf.close()


def test_versions_from_model_weights_id(tmp_path):
    trajs = []
    for k in range(5):
        d = make_traj(k, as_dict=True)
        del d["versions"]
        d["model_weights_id"] = str(10 * k)
        trajs.append(d)
    s = Staleness(10, version_of=int)
    with zreplay.TrajectoryReplayBuffer(seed=0, sampler=s, sample_window_size=0) as buf:
        buf.add_trajectories(trajs)
        assert set(codes_of(buf.sample(400, version=40)) // 10000) == {3, 4}
        with pytest.raises(KeyError, match="version_key"):
            buf.core.set_sampler(Staleness(1))  # no 'versions' column here
            buf.sample(4, version=1)


def test_current_version_is_saved_with_the_buffer(tmp_path):
    path = str(tmp_path / "b")
    with closing(builders.writer(path, sampler=Staleness(1))) as buf:
        builders.add_full(buf, range(6))
        # no version given yet: staleness is counted from the newest version stored
        assert set(codes_of(buf.sample(300)) // 10000) == {4, 5}
        buf.sample(4, version=3.0)
    with closing(builders.writer(path, sampler=Staleness(1))) as buf:
        assert buf.sampler.current_version == 3
        assert set(codes_of(buf.sample(300)) // 10000) == {2, 3, 4, 5}  # newer: fresh
    view = zreplay.open(path, sampler=Staleness(0, current_version=4))
    assert set(codes_of(view.sample(100)) // 10000) == {4, 5}


def test_all_stale_is_a_clear_error():
    buf = builders.writer(sampler=Staleness(2))
    builders.add_full(buf, range(3))
    with pytest.raises(EmptyBufferError, match="max_staleness=2 versions behind version 9"):
        buf.sample(4, version=9.0)
    with pytest.raises(ValueError, match="stale_weight"):
        Staleness(2, stale_weight=2.0)
    with pytest.raises(ValueError, match="max_staleness"):
        Staleness(-1)
    buf.close()


@pytest.mark.parametrize("evict_stale", [True, False])
def test_a_full_buffer_drops_stale_arrivals_first(tmp_path, evict_stale):
    path = str(tmp_path / "b")
    s = Staleness(1, evict_stale=evict_stale, current_version=5)
    buf = builders.writer(path, capacity=3 * 18, sampler=s)
    assert builders.add_full(buf, (4, 5)) == [0, 1]
    # not full yet: a stale trajectory is kept either way
    assert builders.add_full(buf, [1]) == [2]
    # full: the next stale one is dropped (with evict_stale), a fresh one evicts the oldest
    got = builders.add_full(buf, [2, 5])
    trajs = map(buf.trajectory, range(buf.num_trajectories))
    kept = {int(t.columns["versions"].flat[0]) for t in trajs}
    if evict_stale:
        assert got == [-1, 3] and kept == {5, 1}  # the version-4 one went, FIFO
        assert buf.sampler.num_dropped == 1
    else:
        assert got == [3, 4] and kept == {1, 2, 5}
    buf.close()
    again = builders.writer(path, capacity=3 * 18, sampler=Staleness(1, evict_stale=True))
    assert again.sampler.num_dropped == int(evict_stale)
    again.close()


def test_view_over_two_writers_follows_refresh(tmp_path):
    path = str(tmp_path / "b")
    a = builders.writer(path, writer_id="a")
    b = builders.writer(path, writer_id="b", capacity=2 * 18)
    builders.add_full(a, range(3))
    builders.add_full(b, (10, 11))
    a.flush(), b.flush()
    view = zreplay.open(path, sampler=Staleness(1), seed=0)
    assert set(codes_of(view.sample(500, version=11)) // 10000) == {10, 11}
    builders.add_full(b, [12])  # evicts 10 from b's segment
    builders.add_full(a, [11])
    a.flush(), b.flush()
    view.refresh()
    got = codes_of(view.sample(800, version=12))
    assert set(got // 10000) == {11, 12}
    check_rows(view.sample(64, version=12))
    a.close(), b.close()


def test_version_key_and_current_version_attribute():
    s = Staleness(0, version_key="rewards")  # any stored column: its smallest value
    buf = builders.writer(sampler=s)
    builders.add_full(buf, range(4))  # rewards == code >= 10000 * k
    s.current_version = 30000
    assert set(codes_of(buf.sample(200)) // 10000) == {3}
    buf.close()


def _versioned(v: float, dtype=torch.float32, obs_dim: int = 2) -> dict:
    return {
        "obs": torch.randn(50, 4, obs_dim).to(dtype),
        "rewards": torch.randn(50, 4),
        "versions": torch.full((50, 4, 1), float(v)),
    }


def test_evict_stale_judges_against_the_newest_version_when_none_was_given():
    """Until a version is passed the newest in the buffer is current: a stale arrival at a
    full buffer is dropped, not admitted over the fresh trajectories (adversarial pass)."""
    s = Staleness(max_staleness=2, evict_stale=True)
    buf = zreplay.TrajectoryReplayBuffer(sampler=s, capacity=400)
    buf.add_trajectories([_versioned(10), _versioned(10)])  # full: 400 rows of version 10
    assert buf.add_trajectories([_versioned(0)]) == [-1]
    assert s.num_dropped == 1 and buf.total_samples == 400
    assert set(np_(buf.sample(500)["versions"]).ravel()) == {10.0}
    buf.close()


def test_evict_stale_validates_before_dropping_and_counts_only_added_batches():
    s = Staleness(max_staleness=2, evict_stale=True)
    buf = zreplay.TrajectoryReplayBuffer(sampler=s, capacity=400)
    buf.add_trajectories([_versioned(10), _versioned(10)])
    buf.sample(8, version=10)
    with pytest.raises(zreplay.errors.SchemaError):  # stale and of the wrong dtype
        buf.add_trajectories([_versioned(0, torch.float64)])
    with pytest.raises(zreplay.errors.SchemaError):  # the whole batch is refused
        buf.add_trajectories([_versioned(0), _versioned(10, obs_dim=3)])
    assert s.num_dropped == 0 and buf.total_samples == 400
    buf.close()
