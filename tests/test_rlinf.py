"""TrajectoryReplayBuffer: RLinf's API and semantics, persistence and resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import check_rows, codes_of, make_traj

import zreplay
from zreplay import EmptyBufferError


def persistent(path, **kw):
    kw.setdefault("seed", 7)
    return zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path, **kw)


def test_constructor_accepts_rlinf_names(bufpath):
    buf = zreplay.TrajectoryReplayBuffer(
        seed=1234,
        enable_cache=True,
        cache_size=5,
        sample_window_size=100,
        auto_save=True,
        auto_save_path=bufpath,
        trajectory_format="pt",
    )
    assert len(buf) == 0 and buf.total_samples == 0 and not buf.is_ready(1)
    buf.close()
    with pytest.raises(ValueError, match="auto_save_path"):
        zreplay.TrajectoryReplayBuffer(auto_save=True)


def test_sample_keys_shapes_dtypes(bufpath):
    with persistent(bufpath) as buf:
        buf.add_trajectories([make_traj(i, epochs=2) for i in range(3)])
        s = buf.sample(11)
        assert set(s) == {
            "actions",
            "intervene_flags",
            "rewards",
            "terminations",
            "truncations",
            "dones",
            "prev_logprobs",
            "versions",
            "curr_obs",
            "next_obs",
        }
        assert s["actions"].shape == (11, 6) and s["actions"].dtype == torch.float32
        assert s["rewards"].shape == (11, 2)
        assert s["dones"].dtype == torch.bool and s["dones"].shape == (11, 2)
        assert s["curr_obs"]["main_images"].dtype == torch.uint8
        assert s["curr_obs"]["main_images"].shape == (11, 8, 8, 3)
        assert s["next_obs"]["states"].shape == (11, 4)
        check_rows(s)


def test_sample_returns_exactly_num_chunks_with_replacement(bufpath):
    with persistent(bufpath) as buf:
        buf.add_trajectories([make_traj(0, T=2, B=1)])
        s = buf.sample(50)  # RLinf would silently clamp to 2
        assert s["actions"].shape[0] == 50
        assert set(codes_of(s)) <= {0, 1}
        with pytest.raises(ValueError):
            buf.sample(0)


def test_empty_buffer_sample_raises(bufpath):
    with persistent(bufpath) as buf, pytest.raises(EmptyBufferError, match="empty"):
        buf.sample(4)


def test_window_limits_sampling_to_last_n_trajectories(bufpath):
    with persistent(bufpath, sample_window_size=2) as buf:
        buf.add_trajectories([make_traj(i) for i in range(6)])
        tids = set(codes_of(buf.sample(500)) // 10000)
        assert tids == {4, 5}
        buf.sample_window_size = 0
        assert set(codes_of(buf.sample(2000)) // 10000) == set(range(6))


def test_uniform_over_transitions(bufpath):
    # Trajectory 1 has 4x the rows of trajectory 0, so it is drawn ~4x as often.
    with persistent(bufpath, sample_window_size=0) as buf:
        buf.add_trajectories([make_traj(0, T=5, B=2), make_traj(1, T=10, B=4)])
        tid = codes_of(buf.sample(20000)) // 10000
        frac = (tid == 1).mean()
        assert abs(frac - 0.8) < 0.02


def test_seed_reproducible_and_distinct(tmp_path):
    out = []
    for i, seed in enumerate((3, 3, 4)):
        with persistent(str(tmp_path / f"b{i}"), seed=seed) as buf:
            buf.add_trajectories([make_traj(j) for j in range(4)])
            out.append(codes_of(buf.sample(64)))
    assert np.array_equal(out[0], out[1])
    assert not np.array_equal(out[0], out[2])


def test_len_total_ready_stats(bufpath):
    with persistent(bufpath, cache_size=2) as buf:
        buf.add_trajectories([make_traj(i, T=4, B=2) for i in range(3)])
        assert len(buf) == 3 and buf.total_samples == 24
        assert buf.is_ready(3) and not buf.is_ready(4)
        buf.flush()
        st = buf.get_stats()
        assert st["num_trajectories"] == 3 and st["total_samples"] == 24
        assert st["cache_size"] == 2  # the RAM tier holds the 2 newest trajectories
        assert st["pending_trajectories"] == 0 and st["committed_trajectories"] == 3


def test_window_zero_in_memory_does_not_crash():
    # RLinf raises ZeroDivisionError for this combination.
    with zreplay.TrajectoryReplayBuffer(sample_window_size=0) as buf:
        buf.add_trajectories([make_traj(0)])
        check_rows(buf.sample(8))


def test_dict_and_foreign_objects_accepted(bufpath):
    class RLinfLike:  # any object with RLinf's Trajectory attributes
        def __init__(self, t):
            self.__dict__.update(vars(t))

    with persistent(bufpath) as buf:
        buf.add_trajectories([make_traj(0, as_dict=True), RLinfLike(make_traj(1))])
        d = make_traj(2, as_dict=True)
        d = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}
        buf.add_trajectories([d])
        check_rows(buf.sample(100))
        assert len(buf) == 3


def test_caller_may_mutate_tensors_after_add(bufpath):
    with persistent(bufpath, enable_cache=False) as buf:
        t = make_traj(0)
        buf.add_trajectories([t])
        t.actions.fill_(-1)
        t.curr_obs["main_images"].fill_(0)
        buf.flush()
        check_rows(buf.sample(64))


def test_weights_id_matches_rlinf_rule(bufpath):
    from zreplay.compat.rlinf_trajectory import rlinf_weights_id

    with persistent(bufpath) as buf:
        t = make_traj(3)
        buf.add_trajectories([t])
        assert buf.trajectory(0)["model_weights_id"] == rlinf_weights_id(t.versions.numpy())


def test_deeper_nested_dicts_are_kept(bufpath):
    # RLinf silently drops obs nested deeper than one level.
    t = make_traj(0, as_dict=True)
    t["curr_obs"] = {**t["curr_obs"], "extra": {"depth": torch.ones(6, 3, 2)}}
    t["next_obs"] = {**t["next_obs"], "extra": {"depth": torch.ones(6, 3, 2)}}
    with persistent(bufpath) as buf:
        buf.add_trajectories([t])
        s = buf.sample(4)
        assert s["curr_obs"]["extra"]["depth"].shape == (4, 2)
