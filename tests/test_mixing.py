"""Offline-to-online mixing: sealed segments (the immutable offline part a dataset import
seeds) and ``samplers.Mixed`` drawing an exact fraction of every batch from them.

Offline rows are told apart by their codes (tests/builders.py: ``tid * 10000 + lane * 100
+ step``): offline trajectories are built with ``tid >= OFFLINE``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from builders import add, reader, tids, trajectory, writer

import zreplay
from zreplay.errors import CorruptBufferError, FormatError, SealedSegmentError, WriterLockedError
from zreplay.samplers import Mixed, Prioritized, Uniform, Window
from zreplay.sampling.clips import ClipSpec
from zreplay.sampling.nstep import NStepSpec
from zreplay.store.format import commit_path

OFFLINE = 1000  # trajectories with tid >= OFFLINE are the sealed segment's


def seeded(path, n_traj: int = 3, T: int = 6, B: int = 3) -> int:
    """A buffer at ``path`` whose segment ``offline`` (sealed) holds ``n_traj``
    trajectories; returns its rows."""
    core = writer(path, writer_id="offline")
    for i in range(n_traj):
        add(core, OFFLINE + i, T, B)
    core.close()
    zreplay.seal(path, "offline")
    return n_traj * T * B


def is_offline(rows) -> np.ndarray:
    return tids(rows) >= OFFLINE


def commit_file(path, wid: str):
    return commit_path(path / "segments" / wid)


def commit_json(path, wid: str) -> dict:
    return json.loads(commit_file(path, wid).read_text())


# -- sealed segments ------------------------------------------------------------------


def test_a_sealed_segment_refuses_a_writer_and_keeps_its_commit(tmp_path):
    seeded(tmp_path)
    before = commit_file(tmp_path, "offline").read_bytes()
    assert commit_json(tmp_path, "offline")["sealed"] is True
    with pytest.raises(SealedSegmentError, match="sealed.*another writer_id") as e:
        writer(tmp_path, writer_id="offline")
    assert isinstance(e.value, RuntimeError)
    assert commit_file(tmp_path, "offline").read_bytes() == before
    # The lock was given back: sealing again (a no-op) takes it.
    zreplay.seal(tmp_path, "offline")
    assert commit_file(tmp_path, "offline").read_bytes() == before


def test_an_unsealed_commit_record_is_unchanged_and_a_bad_marker_is_damage(tmp_path):
    core = writer(tmp_path)
    add(core, 0)
    core.close()
    assert "sealed" not in commit_json(tmp_path, "default")
    rec = commit_json(tmp_path, "default")
    rec["sealed"] = "yes"
    commit_file(tmp_path, "default").write_text(json.dumps(rec))
    with pytest.raises(CorruptBufferError, match="sealed"):
        zreplay.open(tmp_path)


def test_seal_needs_a_committed_segment_and_no_live_writer(tmp_path):
    core = writer(tmp_path)
    add(core, 0)
    core.flush()
    with pytest.raises(WriterLockedError):
        zreplay.seal(tmp_path, "default")
    core.close()
    with pytest.raises(FormatError, match="no committed segment 'other'"):
        zreplay.seal(tmp_path, "other")
    assert "sealed" not in commit_json(tmp_path, "default")


# -- what a writer sees beside its sealed segments ------------------------------------


def test_a_writer_sees_offline_and_online_rows_with_capacity_counting_its_own(tmp_path):
    n_off = seeded(tmp_path)
    core = writer(tmp_path, capacity=36, writer_id="online")
    assert core.num_rows == n_off and core.num_trajectories == 3
    for i in range(5):
        add(core, i)
    # Capacity evicts online trajectories only: two of five fit beside the offline rows.
    assert core.num_rows == n_off + 36 and core.num_trajectories == 3 + 2
    rows = core.rows(np.arange(core.num_rows))["obs"]
    assert sorted(set(tids(rows))) == [3, 4, OFFLINE, OFFLINE + 1, OFFLINE + 2]
    # Segments in name order, as a view lays them: "offline" before "online".
    assert is_offline(rows[:n_off]).all() and not is_offline(rows[n_off:]).any()
    core.flush()
    st = core.engine.stats()
    assert (st["rows"], st["trajectories"]) == (n_off + 36, 5)
    assert (st["offline_rows"], st["committed_trajectories"]) == (n_off, 2)
    core.close()
    view = zreplay.open(tmp_path)
    np.testing.assert_array_equal(view.rows(np.arange(view.num_rows))["obs"], rows)


def test_clear_empties_the_online_segment_and_keeps_the_offline_one(tmp_path):
    n_off = seeded(tmp_path)
    core = writer(tmp_path, writer_id="online", sampler=Mixed(0.5))
    add(core, 0)
    core.engine.clear()
    assert core.num_rows == n_off
    assert is_offline(core.sample(64)["obs"]).all()  # online empty: all offline
    add(core, 1)
    assert is_offline(core.sample(64)["obs"]).sum() == 32
    core.close()
    assert zreplay.open(tmp_path).num_rows == n_off + 18
    assert commit_json(tmp_path, "offline")["sealed"] is True


# -- exact fractions ------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_every_row_batch_holds_exactly_round_f_n_offline_rows(tmp_path, seed):
    seeded(tmp_path)
    rng = np.random.default_rng(seed)
    f = float(rng.choice([0.5, 0.25, 0.1, 0.9, 0.33]))
    core = writer(tmp_path, writer_id="online", sampler=Mixed(f), seed=seed)
    for i in range(4):
        add(core, i, T=int(rng.integers(2, 9)))
    for n in (1, 2, 7, 64, 255):
        for _ in range(5):
            off = is_offline(core.sample(n)["obs"])
            k = round(f * n)
            assert off.sum() == k and off[:k].all()  # the offline ones come first
    core.close()


def test_each_side_is_drawn_uniformly_and_by_the_wrapped_sampler(tmp_path):
    seeded(tmp_path, n_traj=2, T=4, B=1)
    core = writer(tmp_path, writer_id="online", sampler=Mixed(0.5), seed=3)
    for i in range(3):
        add(core, i, T=4, B=1)
    got = tids(core.sample(6000)["obs"])
    counts = np.bincount(got[got < OFFLINE], minlength=3)
    assert counts.min() > 850  # ~1000 each of the 3000 online rows
    core.close()
    # Window(1) inside: each side's newest trajectory only.
    core = writer(tmp_path, writer_id="online", sampler=Mixed(0.5, Window(1)), seed=3)
    assert set(tids(core.sample(200)["obs"])) == {2, OFFLINE + 1}
    core.close()


def test_a_linear_schedule_anneals_over_steps():
    m = Mixed(0.9, end=0.1, steps=8)
    assert [round(m.fraction(s), 6) for s in (0, 4, 8, 100)] == [0.9, 0.5, 0.1, 0.1]
    assert [m.split(10, s) for s in range(10)] == [9, 8, 7, 6, 5, 4, 3, 2, 1, 1]
    assert Mixed(0.25).split(6, 0) == round(1.5) == 2  # Python's round, as TorchRL's


def test_the_schedule_follows_the_buffer_steps_and_resumes_after_reopen(tmp_path):
    seeded(tmp_path)

    def open_core():
        return writer(tmp_path, writer_id="online", sampler=Mixed(1.0, end=0.0, steps=10))

    core = open_core()
    add(core, 0)
    seen = [int(is_offline(core.sample(10)["obs"]).sum()) for _ in range(4)]
    assert seen == [10, 9, 8, 7]
    core.close()
    core = open_core()
    assert int(is_offline(core.sample(10)["obs"]).sum()) == 6
    core.close()


def test_the_schedule_resumes_from_a_checkpoint(tmp_path):
    seeded(tmp_path / "buf")
    rb = zreplay.TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=str(tmp_path / "buf"),
        writer_id="online",
        sampler=Mixed(1.0, end=0.0, steps=10),
        seed=0,
    )
    rb.core.add([trajectory(0)])

    def offline_of_next_batch() -> int:
        return int(is_offline(rb.sample(10)["obs"].numpy()).sum())

    assert [offline_of_next_batch() for _ in range(3)] == [10, 9, 8]
    rb.save_checkpoint(str(tmp_path / "ck"))
    assert [offline_of_next_batch() for _ in range(3)] == [7, 6, 5]
    rb.load_checkpoint(str(tmp_path / "ck"))
    assert offline_of_next_batch() == 7
    assert rb.core.num_rows == 54 + 18  # the offline part stays beside the loaded rows
    rb.close()


# -- clips and n-step -----------------------------------------------------------------


def test_clips_never_cross_an_episode_or_a_part_and_split_exactly(tmp_path):
    seeded(tmp_path, n_traj=2, T=5, B=2)
    core = writer(tmp_path, writer_id="online", sampler=Mixed(0.25), seed=1)
    for i in range(3):
        add(core, i, T=7, B=2)
    spec = ClipSpec(history_len=3)
    for n in (4, 9, 32):
        obs = core.sample_clips(spec, n)["obs"][..., 0]  # [n, 3] codes
        lane = obs // 100
        assert (lane == lane[:, :1]).all() and (np.diff(obs, axis=1) == 1).all()
        off = obs[:, 0] >= OFFLINE * 10000
        assert off.sum() == round(0.25 * n) and off[: round(0.25 * n)].all()
    core.close()


def test_nstep_windows_stay_on_their_side(tmp_path):
    seeded(tmp_path, n_traj=2, T=5, B=2)
    core = writer(tmp_path, writer_id="online", sampler=Mixed(0.5), seed=2)
    for i in range(3):
        add(core, i, T=7, B=2)
    spec = NStepSpec(n=3, gamma=0.5, reward_key="reward", obs_key="obs")
    got = core.sample_nstep(spec, 40)
    first, last = got["obs"][:, 0], got["next_obs"][:, 0]
    assert ((first // 100) == (last // 100)).all()  # same trajectory and lane
    assert (first >= OFFLINE * 10000).sum() == 20
    core.close()


# -- facades and views ----------------------------------------------------------------


def test_a_view_and_each_facade_mix_exactly(tmp_path):
    seeded(tmp_path)
    core = writer(tmp_path, writer_id="online")
    add(core, 0)
    add(core, 1)
    core.close()
    view = zreplay.open(tmp_path, sampler=Mixed(0.3), seed=0)
    for _ in range(5):
        assert is_offline(view.sample(20)["obs"]).sum() == 6
    clips = view.sample_clips(10, history_len=2)["obs"]
    assert is_offline(clips[:, 0]).sum() == 3
    rlinf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(tmp_path), writer_id="online", sampler=Mixed(0.5)
    )
    assert is_offline(rlinf.sample(16)["obs"].numpy()).sum() == 8
    rlinf.close()
    swm = zreplay.ReplayBuffer(
        1000, path=str(tmp_path), writer_id="online", history_len=2, sampler=Mixed(0.75)
    )
    assert is_offline(swm.sample(8)["obs"][:, 0]).sum() == 6
    swm.close()


def test_an_imported_dataset_is_the_sealed_offline_part(tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("av")
    from lerobot_layout import write_dataset

    write_dataset(tmp_path / "ds", lengths=(3, 4), video=False)
    zreplay.import_lerobot(tmp_path / "ds", tmp_path / "buf")
    assert commit_json(tmp_path / "buf", "offline")["sealed"] is True
    rb = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(tmp_path / "buf"), sampler=Mixed(0.5)
    )
    assert len(rb) == 2 and rb.core.num_rows == 7  # writer "default" beside "offline"
    assert rb.sample(5)["action"].shape == (5, 2)  # online empty: all offline
    rb.close()


# -- empty sides and refusals ---------------------------------------------------------


def test_without_sealed_rows_mixed_draws_what_its_sampler_draws(tmp_path):
    a = writer(tmp_path / "a", sampler=Mixed(0.5), seed=7)
    b = writer(tmp_path / "b", sampler=Uniform(), seed=7)
    for core in (a, b):
        add(core, 0)
        add(core, 1)
    np.testing.assert_array_equal(a.sample(50)["obs"], b.sample(50)["obs"])
    a.close()
    b.close()


def test_only_offline_rows_give_an_all_offline_batch(tmp_path):
    seeded(tmp_path)
    core = writer(tmp_path, writer_id="online", sampler=Mixed(0.1))
    assert is_offline(core.sample(30)["obs"]).all()
    assert core.sample_clips(ClipSpec(history_len=2), 5)["obs"].shape[:2] == (5, 2)
    core.close()


@pytest.mark.parametrize(
    "bad, error",
    [
        (1.5, ValueError),
        (-0.1, ValueError),
        (math.nan, ValueError),
        (True, TypeError),
        ("0.5", TypeError),
        (np.array([0.5, 0.5]), TypeError),
    ],
)
def test_bad_fractions_are_refused_before_a_buffer_is_made(tmp_path, bad, error):
    with pytest.raises(error):
        zreplay.ReplayBuffer(10, path=str(tmp_path / "b"), sampler=Mixed(bad))
    with pytest.raises(error):
        Mixed(0.5, end=bad, steps=3)
    assert not (tmp_path / "b").exists()


def test_numbers_of_any_kind_are_fractions_and_bad_schedules_are_refused():
    assert Mixed(np.float32(0.25)).offline == 0.25 and Mixed(torch.tensor(0.5)).offline == 0.5
    assert Mixed(np.int64(1)).offline == 1.0
    with pytest.raises(ValueError, match="both end= and steps="):
        Mixed(0.5, end=0.1)
    with pytest.raises(ValueError):
        Mixed(0.5, end=0.1, steps=0)
    with pytest.raises(TypeError, match="priorities"):
        Mixed(0.5, Prioritized())
    with pytest.raises(TypeError, match="hook"):
        Mixed(0.5, lambda *a: None)


def test_its_state_is_json_and_a_copy_keeps_the_schedule():
    m = Mixed(0.8, Window(3), end=0.2, steps=100)
    state = m.state_dict()
    assert json.loads(json.dumps(state)) == state and state["sampler"]["size"] == 3
    c = m.unbound_copy()
    assert (c.offline, c.end, c.steps, c.sampler.size) == (0.8, 0.2, 100, 3)


def test_a_reader_core_marks_only_sealed_segments(tmp_path):
    seeded(tmp_path)
    core = writer(tmp_path, writer_id="online")
    add(core, 0)
    core.close()
    r = reader(tmp_path)
    assert [s.sealed for s in r.engine.space().segments] == [True, False]
    r.close()
