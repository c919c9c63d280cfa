"""Numbers users pass come in many types: numpy scalars from index arithmetic, 0-d arrays,
0-d tensors of any dtype (bf16 under mixed precision).  Every one works where an int or
float is expected, nothing that JSON cannot hold ever reaches the state saved with a
commit, and a sampler whose state cannot be saved is refused when it is set, while the
rows keep being committed whatever the sampler does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import check_rows, make_traj

import zreplay
from zreplay.samplers import Prioritized, Sampler, Staleness, Uniform, Window


def trb(path, **kw):
    kw.setdefault("sample_window_size", 0)
    return zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), **kw)


@pytest.mark.parametrize(
    "n",
    [
        np.int64(16),
        np.int32(16),
        np.array(16),
        torch.tensor(16),
        torch.tensor(16, dtype=torch.int32),
    ],
    ids=["np.int64", "np.int32", "0-d array", "tensor", "int32 tensor"],
)
def test_a_numpy_or_torch_count_never_poisons_later_commits(tmp_path, n):
    """sample(np.int64(16)) stored a numpy int in the stream state: every later commit
    failed (blaming disk space), close() failed, and later adds were lost on reopen."""
    buf = trb(tmp_path / "b")
    buf.add_trajectories([make_traj(0)])
    buf.flush()
    check_rows(buf.sample(n))
    assert len(check_rows(buf.sample(n))) == 16
    buf.add_trajectories([make_traj(1)])
    buf.flush()
    buf.close()
    with trb(tmp_path / "b") as again:
        assert len(again) == 2
        assert again.core.stream.num_sampled == 32


@pytest.mark.parametrize(
    "version",
    [np.int64(3), np.float32(3.0), torch.tensor(3), torch.tensor(3.0, dtype=torch.bfloat16)],
    ids=["np.int64", "np.float32", "tensor", "bf16 tensor"],
)
def test_a_numpy_or_torch_policy_version_is_a_number(tmp_path, version):
    buf = trb(tmp_path / "b", sampler=Staleness(np.int64(1)))
    buf.add_trajectories([make_traj(2), make_traj(3)])  # versions 2 and 3
    got = buf.sample(64, version=version)
    assert set(np.unique(got["versions"].numpy()[:, 0])) <= {2.0, 3.0}
    assert type(buf.sampler.current_version) is float
    buf.add_trajectories([make_traj(4)])
    buf.close()  # the version was saved with the commit
    with trb(tmp_path / "b", sampler=Staleness(1)) as again:
        assert again.sampler.current_version == 3.0 and len(again) == 3


def test_numpy_numbers_configure_samplers(tmp_path):
    s = Staleness(np.float32(1.0), stale_weight=np.float64(0.5))
    assert s.max_staleness == 1 and type(s.stale_weight) is float
    s.current_version = torch.tensor(7)
    assert s.current_version == 7.0 and type(s.current_version) is float
    assert Window(np.int64(3)).size == 3 and type(Window(np.int64(3)).size) is int
    buf = trb(tmp_path / "b", sample_window_size=np.int64(2))
    buf.add_trajectories([make_traj(i) for i in range(3)])
    assert set(check_rows(buf.sample(64)) // 10000) <= {1, 2}
    buf.close()


def test_counts_that_are_not_integers_are_refused_before_anything_is_drawn(tmp_path):
    buf = trb(tmp_path / "b")
    buf.add_trajectories([make_traj(0)])
    for bad in (16.0, True, np.float64(3), torch.tensor([4, 4]), "8"):
        with pytest.raises(TypeError, match="num_chunks must be an integer"):
            buf.sample(bad)
    with pytest.raises(ValueError, match="num_chunks must be >= 1"):
        buf.sample(np.int64(0))
    assert buf.core.stream.step == 0  # nothing was drawn
    buf.close()


def test_integers_beyond_int64_are_refused_naming_the_argument(tmp_path):
    """A count, length or index too large for any array is refused at the facade, in its
    words, not deep inside numpy (``Maximum allowed dimension``, ``OverflowError``)."""
    buf = trb(tmp_path / "b")
    buf.add_trajectories([make_traj(0)])
    view = zreplay.open(tmp_path / "b")
    for call, name in (
        (lambda: buf.sample(2**70), "num_chunks"),
        (lambda: view.sample(2**63), "n"),
        (lambda: view.sample_clips(4, 2**70), "history_len"),
        (lambda: view.sample_nstep(4, n=2**70), "n"),
    ):
        with pytest.raises(ValueError, match=f"{name} must fit a 64-bit integer"):
            call()
    buf.close()


def test_the_other_facades_take_numpy_and_torch_numbers(tmp_path):
    path = tmp_path / "b"
    with trb(path) as buf:
        buf.add_trajectories([make_traj(i) for i in range(2)])
    view = zreplay.open(path)
    assert len(check_rows(view.sample(np.int64(8)))) == 8
    assert view.sample_clips(torch.tensor(3), history_len=np.int64(2))["actions"].shape[:2] == (
        3,
        2,
    )
    rb = zreplay.ReplayBuffer(max_steps=np.int64(100), history_len=2, path=tmp_path / "swm")
    rb.write_episode({"obs": np.zeros((5, 3), np.float32), "action": np.zeros((5, 2), np.float32)})
    got = rb.sample(np.int64(4), step=torch.tensor(2), version=np.float32(1.0))
    assert got["obs"].shape == (4, 2, 3)
    rb.write_episode({"obs": np.ones((5, 3), np.float32), "action": np.zeros((5, 2), np.float32)})
    rb.close()
    rb = zreplay.ReplayBuffer(max_steps=100, history_len=2, path=tmp_path / "swm")
    assert rb.num_episodes == 2
    rb.close()


def test_load_checkpoint_takes_numpy_and_torch_ranks(tmp_path):
    with trb(tmp_path / "src") as src:
        src.add_trajectories([make_traj(i) for i in range(4)])
    with trb(tmp_path / "dst") as dst:
        dst.load_checkpoint(
            str(tmp_path / "src"), True, local_rank=np.int64(1), world_size=torch.tensor(2)
        )
        assert len(dst) == 2
        assert set(check_rows(dst.sample(32)) // 10000) == {2, 3}
    with trb(tmp_path / "dst") as again:
        assert len(again) == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_update_priorities_takes_every_floating_dtype_torch_produces(tmp_path, dtype):
    buf = trb(tmp_path / "b", sampler=Prioritized(alpha=1.0, eps=0.0))
    buf.add_trajectories([make_traj(0)])
    got = buf.sample(8)
    td_error = torch.full((8,), 2.0, dtype=dtype)
    assert buf.update_priorities(got["index"], td_error.abs()) == 8
    np.testing.assert_allclose(buf.priorities(got["index"].numpy()), 2.0)
    buf.update_priorities(got["index"], torch.tensor(3.0, dtype=dtype))  # one for all
    np.testing.assert_allclose(buf.priorities(got["index"].numpy()), 3.0)
    buf.close()


class _NumpyState(Uniform):
    """A user's sampler whose state holds a numpy number."""

    def state_dict(self) -> dict:
        return {**super().state_dict(), "temperature": np.float32(0.5)}


def test_a_sampler_whose_state_cannot_be_saved_is_refused_when_set(tmp_path):
    with pytest.raises(TypeError, match=r"\['temperature'\] is float32"):
        trb(tmp_path / "b", sampler=_NumpyState())
    buf = trb(tmp_path / "c")
    with pytest.raises(TypeError, match="temperature"):
        buf.core.set_sampler(_NumpyState())
    buf.close()


class _Drifting(Uniform):
    """A sampler whose state turns unsaveable after it was bound."""

    def __init__(self):
        self.level = 1

    def config(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "level": self.level}

    def load_state_dict(self, state: dict) -> None:
        self.level = state.get("level", 1)


def test_rows_are_committed_whatever_state_the_sampler_drifts_into(tmp_path):
    sampler = _Drifting()
    buf = trb(tmp_path / "b", sampler=sampler)
    buf.add_trajectories([make_traj(0)])
    buf.flush()
    sampler.level = np.int64(2)  # set directly, past any check
    buf.add_trajectories([make_traj(1)])
    with pytest.raises(TypeError, match="everything added is committed, but not the sampler"):
        buf.flush()
    assert zreplay.open(tmp_path / "b").num_trajectories == 2  # the rows went in
    sampler.level = 3
    buf.add_trajectories([make_traj(2)])
    buf.flush()  # fixed: saved again
    buf.close()
    with trb(tmp_path / "b", sampler=_Drifting()) as again:
        assert len(again) == 3 and again.sampler.level == 3


def test_the_conversions_themselves():
    from zreplay.numbers import as_array, as_float, as_int, check_json

    assert as_int(np.uint8(7), "n") == 7 and type(as_int(torch.tensor(7), "n")) is int
    assert as_float(torch.tensor(1.5, dtype=torch.bfloat16), "x") == 1.5
    for bad in (True, 1.0, None, [1], np.array([1, 2])):
        with pytest.raises(TypeError):
            as_int(bad, "n")
    with pytest.raises(ValueError, match="finite"):
        as_float(float("nan"), "x")
    a = as_array(torch.ones(3, dtype=torch.bfloat16))
    assert a.dtype == np.float32 and a.tolist() == [1.0, 1.0, 1.0]
    check_json({"a": [1, 2.0, "x", None, {"b": True}]}, "state")
    with pytest.raises(TypeError, match=r"state\['a'\]\[1\] is int64"):
        check_json({"a": [1, np.int64(2)]}, "state")
    assert issubclass(_NumpyState, Sampler)


@pytest.mark.parametrize(
    "kw",
    [
        {"capacity": float("nan")},
        {"capacity": 2.5},
        {"capacity": torch.tensor(True)},
        {"cache_size": float("inf")},
        {"ram_budget_bytes": float("nan")},
        {"staging_bytes": 2.5},
        {"sample_window_size": 1.5},
    ],
    ids=lambda kw: f"{next(iter(kw))}={next(iter(kw.values()))}",
)
def test_sizes_that_are_not_whole_numbers_are_refused_at_construction(tmp_path, kw):
    """capacity=nan half-published the first add and left len() at -1; others failed at
    the first add, or silently meant something else (nan: unlimited, 2.5: 2)."""
    with pytest.raises((TypeError, ValueError)):
        trb(tmp_path / "b", **kw)


def test_a_torchrl_storage_refuses_a_fractional_max_size(tmp_path):
    from zreplay.torchrl import ZarrStorage

    with pytest.raises(TypeError, match="max_size"):
        ZarrStorage(8.7, tmp_path / "z")


@pytest.mark.parametrize(
    "kw",
    [
        {"min_diff": float("nan"), "max_diff": 10.0},
        {"publish_every_s": float("nan")},
        {"publish_every_s": -1},
    ],
)
def test_rate_limiters_refuse_numbers_that_are_no_bounds(kw):
    """NaN bounds were written into the learner progress file (not JSON)."""
    with pytest.raises(ValueError):
        zreplay.RateLimiter(1.0, 1, **{"min_diff": None, "max_diff": None, **kw})
    with pytest.raises(TypeError):
        zreplay.MinSize(2.5)


def test_a_trajectory_index_that_is_no_integer_is_an_error(tmp_path):
    buf = trb(tmp_path / "b")
    buf.add_trajectories([make_traj(0)])
    for bad in (float("nan"), float("inf"), 0.5):
        with pytest.raises(TypeError, match="trajectory must be an integer"):
            buf.trajectory(bad)  # a bare StopIteration ended a map() over indices silently
    buf.close()


class _Cycle(Uniform):
    def __init__(self):
        self.box = []

    def config(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "box": self.box}


def test_a_sampler_state_that_contains_itself_never_holds_rows_back(tmp_path):
    sampler = _Cycle()
    buf = trb(tmp_path / "b", sampler=sampler)
    sampler.box.append(sampler.box)  # a cycle: no JSON for it
    buf.add_trajectories([make_traj(0)])
    with pytest.raises(TypeError, match="contains itself"):
        buf.flush()
    assert zreplay.open(tmp_path / "b").num_trajectories == 1  # the rows went in
    sampler.box.clear()
    buf.close()


def test_a_checkpoint_is_refused_when_the_sampler_state_cannot_be_saved(tmp_path):
    """save_checkpoint() silently wrote the last saved state (step 0 for a buffer at
    step 5)."""
    sampler = _Drifting()
    buf = trb(tmp_path / "b", sampler=sampler)
    buf.add_trajectories([make_traj(0)])
    buf.flush()
    sampler.level = np.int64(4)
    with pytest.raises(TypeError, match="level"):
        buf.save_checkpoint(str(tmp_path / "ck"))
    assert not (tmp_path / "ck").exists()
    sampler.level = 4
    buf.save_checkpoint(str(tmp_path / "ck"))
    buf.close()
