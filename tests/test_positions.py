"""One meaning for a sample's positions: ``[0, num_rows)`` over the visible rows, oldest
first, in a writer exactly as in a view over it, also once the writer evicted (its
oldest visible row is then global row ``low_row > 0``).  Global rows stay the stable
identities: a prioritized batch's ``index`` and TorchRL's ring."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from builders import add, tids, writer
from conftest import make_traj

import zreplay
from zreplay.samplers import Prioritized, Sampler

T, B = 4, 3  # rows per trajectory: 12


def fixed_positions(n: int) -> np.ndarray:
    return np.array([0, 1, n - 1], np.int64)


def hook(step, buffer, batch_size, history_len):
    """A sampler hook written against positions: the two oldest rows and the newest."""
    return fixed_positions(hook.n)


class Fixed(Sampler):
    """A sampler that draws fixed positions with no reference to where they start."""

    def draw_rows(self, ctx, n):
        return fixed_positions(ctx.space.num_rows), {}

    def draw_units(self, ctx, units, n):
        return fixed_positions(units.total), {}

    def config(self) -> dict:
        return {}


def _evicting_rlinf(path, sampler):
    """A TrajectoryReplayBuffer whose oldest trajectories were evicted (low_row > 0)."""
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, capacity=5 * T * B, sampler=sampler, seed=0
    )
    for t in range(9):
        buf.add_trajectories([make_traj(t, T=T, B=B)])
    buf.flush()
    assert buf.core.engine.state.index.low_row > 0  # it did evict
    return buf


@pytest.mark.parametrize("sampler", [hook, Fixed()], ids=["hook", "sampler"])
def test_a_rlinf_writer_and_its_view_draw_the_same_rows_after_eviction(tmp_path, sampler):
    buf = _evicting_rlinf(tmp_path / "b", sampler)
    view = zreplay.open(tmp_path / "b", sampler=sampler)
    n = hook.n = buf.total_samples
    assert view.num_rows == n
    got_w = buf.sample(3)["actions"].numpy()
    got_v = view.sample(3)["actions"]
    np.testing.assert_array_equal(got_w, got_v)
    # Position 0 is the oldest visible trajectory's first row (lane 0, step 0).
    oldest = 9 - n // (T * B)
    assert got_w[0, 0] == oldest * 10000 and got_w[2, 0] == 8 * 10000 + (B - 1) * 100 + T - 1
    buf.close()


def test_core_rows_and_episodes_of_a_writer_and_its_view_agree_at_every_position(tmp_path):
    buf = _evicting_rlinf(tmp_path / "b", None)
    view = zreplay.open(tmp_path / "b")
    wcore, vcore, n = buf.core, view.core, buf.total_samples
    for i in range(n):
        np.testing.assert_array_equal(
            wcore.rows([i], ["actions"])["actions"], vcore.rows([i], ["actions"])["actions"]
        )
    np.testing.assert_array_equal(
        wcore.rows(np.arange(-n, n))["actions"], vcore.rows(np.arange(-n, n))["actions"]
    )
    with pytest.raises(IndexError):
        wcore.rows([n])
    # Episode rows (what clips and n-step windows read) are positions in both.
    we, ve = wcore.episodes(), vcore.episodes()
    e = np.arange(len(ve))
    np.testing.assert_array_equal(we.rows(e, np.zeros_like(e)), ve.rows(e, np.zeros_like(e)))
    assert we.rows(e[:1], np.zeros(1, np.int64))[0] == 0
    buf.close()


def _swm(path, sampler):
    rb = zreplay.ReplayBuffer(20, path=path, sampler=sampler, seed=0)
    for e in range(6):
        rb.write_episode({"action": np.arange(7, dtype=np.float32)[:, None] + 100 * e})
    assert rb.core.engine.state.index.low_row > 0  # it did evict
    return rb


@pytest.mark.parametrize("sampler", [hook, Fixed()], ids=["hook", "sampler"])
def test_a_stable_worldmodel_writer_and_its_view_draw_the_same_clips_after_eviction(
    tmp_path, sampler
):
    rb = _swm(tmp_path / "rb", sampler)
    rb.flush()
    view = zreplay.open(tmp_path / "rb", sampler=sampler)
    n = hook.n = rb.num_steps_stored
    assert len(rb) == n == view.num_clips()  # history_len 1: a clip is a row
    got_w = rb.sample(3)["action"]
    got_v = view.sample_clips(3)["action"]
    np.testing.assert_array_equal(got_w, got_v)
    np.testing.assert_array_equal(got_w[:, 0, 0], [400, 401, 506])  # episodes 4, 5 kept
    for i in range(n):
        np.testing.assert_array_equal(rb[i]["action"], view.clips([i])["action"][0])
        np.testing.assert_array_equal(rb.core.rows([i])["action"], view.core.rows([i])["action"])
    rb.close()


def test_a_prioritized_index_still_names_its_rows_after_an_eviction(tmp_path):
    """``index`` is a global row: an eviction between sample and update changes every
    position, not the rows the update names."""
    core = writer(tmp_path / "b", sampler=Prioritized(alpha=1.0), capacity=4 * T * B)
    for t in range(4):
        add(core, t, T, B)
    batch = core.sample(16)
    # The data drawn is the row the index names: row g holds code tid*10000+lane*100+step.
    g = batch["index"]
    code = (g // (T * B)) * 10000 + (g % (T * B)) // T * 100 + g % T
    np.testing.assert_array_equal(batch["obs"][:, 0], code)
    add(core, 4, T, B)
    add(core, 5, T, B)  # trajectories 0 and 1 are evicted: positions moved by 24
    assert core.engine.state.index.low_row == 2 * T * B
    alive = tids(batch["obs"]) >= 2
    assert alive.any() and not alive.all()
    assert core.update_priorities(batch["index"], np.full(16, 1e9)) == int(alive.sum())
    leaves = core.priorities(batch["index"])
    assert (leaves[alive] > 1e8).all() and (leaves[~alive] == 0).all()
    again = core.sample(256)
    assert set(again["index"].tolist()) <= set(batch["index"][alive].tolist())
    assert set(again["obs"][:, 0].tolist()) <= set(batch["obs"][alive, 0].tolist())
    core.close()


def test_a_torchrl_ring_that_evicted_holds_lazy_tensor_storages_slots(tmp_path):
    """ZarrStorage maps slots to global rows; once old rows were evicted they are no
    longer positions, and every slot still reads what LazyTensorStorage holds there."""
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    from zreplay.torchrl import ZarrStorage

    M = 6
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(M), batch_size=2)
    new = TensorDictReplayBuffer(storage=ZarrStorage(M, path=tmp_path / "s"), batch_size=2)
    for g0, n in [(0, 4), (4, 5), (9, 1), (10, 7), (17, 3)]:
        td = TensorDict({"g": torch.arange(g0, g0 + n)}, batch_size=[n])
        ref.extend(td)
        new.extend(td)
    assert new.storage.core.engine.state.index.low_row > 0  # the ring evicted on disk
    slots = torch.arange(M)
    assert new.storage.get(slots)["g"].tolist() == ref.storage.get(slots)["g"].tolist()
    assert new.storage[:]["g"].tolist() == ref.storage[:]["g"].tolist()
    new.storage.close()


def test_a_writers_row_space_runs_from_position_0_after_eviction():
    """The writer's row space converts its global offsets lazily: its range, trajectory
    starts and trajectory lookups are positions, and its segment maps them back."""
    core = writer(None, capacity=5 * T * B)
    for t in range(9):
        add(core, t, T, B)
    low = core.engine.state.index.low_row
    space = core.engine.locked(lambda snap: snap.space)
    n, G = core.num_rows, core.num_trajectories
    assert low > 0 and space.lo == 0 and space.hi == space.num_rows == n
    np.testing.assert_array_equal(space.starts(np.arange(G + 1)), space.offsets)
    np.testing.assert_array_equal(space.offsets, np.arange(G + 1) * T * B)
    pos = np.arange(n)
    np.testing.assert_array_equal(space.trajectory_of(pos), pos // (T * B))
    (seg,) = space.segments
    np.testing.assert_array_equal(seg.rows_at(pos), pos + low)
    np.testing.assert_array_equal(seg.positions(pos + low), pos)
    core.close()
