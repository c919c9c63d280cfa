"""Priorities: prioritized draws match their priorities (chi-square), importance weights,
updates (bad input, stale after eviction, new rows at the running max), priorities kept
across close/reopen, checkpoints and state_dict, views over several writers, and a
prioritized buffer left open at exit."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
import zarr
from conftest import check_rows, codes_of, make_traj
from test_all_or_nothing import assert_exactly
from test_all_or_nothing import persistent as unwindowed
from test_samplers import episode, np_, row_code, trb
from test_sumtree import chi2_critical_p001, chi2_stat

import zreplay
from zreplay.samplers import Prioritized, PrioritizedClips, Uniform

ROWS_PER_TRAJ = 18  # make_traj: T=6, B=3


def _tree(buf):
    return buf.sampler._segs[0].state.tree


@pytest.mark.parametrize("stratified", [False, True])
def test_prioritized_frequencies_match_priorities(tmp_path, stratified):
    alpha, eps = 0.7, 1e-6
    buf = trb(sampler=Prioritized(alpha=alpha, eps=eps, stratified=stratified), seed=5)
    buf.add_trajectories([make_traj(i) for i in range(6)])
    n = 6 * ROWS_PER_TRAJ
    p = np.random.default_rng(0).lognormal(0.0, 1.0, n)
    assert buf.update_priorities(np.arange(n), p) == n
    counts = np.zeros(n)
    for _ in range(60):
        b = buf.sample(1000)
        idx = np_(b["index"])
        assert np.array_equal(check_rows(b), row_code(idx))  # the data are the drawn rows
        counts += np.bincount(idx, minlength=n)
    probs = (p + eps) ** alpha
    probs /= probs.sum()
    assert chi2_stat(counts, probs) < chi2_critical_p001(n - 1)
    # and the test can fail: the same counts against uniform probabilities
    assert chi2_stat(counts, np.full(n, 1 / n)) > chi2_critical_p001(n - 1)
    buf.close()


def test_prioritized_clip_starts_match_priorities():
    """PrioritizedClips: P(clip) is its start row's leaf over the leaves of valid starts."""
    alpha, h = 1.0, 3
    rb = zreplay.ReplayBuffer(1000, history_len=h, sampler=PrioritizedClips(h, alpha=alpha), seed=1)
    lengths = [4, 9, 2, 12]  # the length-2 episode has no clip
    for k, L in enumerate(lengths):
        rb.write_episode(episode(L, base=100 * k))
    rows = np.arange(sum(lengths))
    p = np.random.default_rng(1).uniform(0.5, 4.0, rows.size)
    rb.update_priorities(rows, p)
    starts = np.concatenate(
        [
            o + np.arange(L - h + 1)
            for o, L in zip(np.cumsum([0, *lengths[:-1]]), lengths, strict=True)
            if L >= h
        ]
    )
    counts = np.zeros(rows.size)
    for _ in range(40):
        b = rb.sample(1000)
        counts += np.bincount(b["index"], minlength=rows.size)
        # the clip starts at its index row: obs = 100 * episode + step
        first = b["obs"][:, 0, 0]
        ep = np.searchsorted(np.cumsum(lengths), b["index"], side="right")
        step = b["index"] - np.concatenate([[0], np.cumsum(lengths)])[ep]
        assert np.array_equal(first, 100 * ep + step)
    assert counts[np.setdiff1d(rows, starts)].sum() == 0  # never a start without a clip
    probs = (p[starts] + 1e-6) ** alpha
    assert chi2_stat(counts[starts], probs / probs.sum()) < chi2_critical_p001(starts.size - 1)
    rb.close()


def test_importance_weights_and_beta_annealing():
    alpha, beta, eps = 0.6, 0.4, 1e-6
    buf = trb(sampler=Prioritized(alpha=alpha, beta=beta, eps=eps, beta_steps=10), seed=2)
    buf.add_trajectories([make_traj(i) for i in range(3)])
    n = 3 * ROWS_PER_TRAJ
    p = np.linspace(0.0, 5.0, n)
    buf.update_priorities(np.arange(n), p)
    leaf = (p + eps) ** alpha
    for step in range(25):
        b = buf.sample(64)
        beta_t = beta + (1 - beta) * min(1.0, step / 10)
        want = (leaf[np_(b["index"])] / leaf.min()) ** -beta_t
        np.testing.assert_allclose(np_(b["weight"]), want, rtol=1e-6)
        assert b["weight"].dtype == torch.float32 and b["index"].dtype == torch.int64
    assert buf.priorities(np.arange(n)).tolist() == leaf.tolist()
    buf.close()


def test_update_priorities_rejects_bad_input_and_needs_a_prioritized_sampler():
    buf = trb(sampler=Prioritized())
    buf.add_trajectories([make_traj(0)])
    with pytest.raises(ValueError, match="finite"):
        buf.update_priorities([0, 1], [1.0, np.nan])
    with pytest.raises(ValueError, match="2 indices but 3 priorities"):
        buf.update_priorities([0, 1], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="integers"):
        buf.update_priorities([0.5], [1.0])
    with pytest.raises(ValueError, match="integers"):  # read as they are set, never truncated
        buf.priorities(np.array([0.5, 1.0]))
    assert buf.update_priorities(torch.tensor([0, 1]), torch.tensor([2.0, 3.0])) == 2
    assert buf.priorities(torch.tensor([0, 1])).tolist() == buf.priorities([0, 1]).tolist()
    assert buf.update_priorities([], []) == 0 and buf.priorities([]).shape == (0,)
    buf.close()
    plain = trb()
    plain.add_trajectories([make_traj(0)])
    with pytest.raises(TypeError, match="Prioritized"):
        plain.update_priorities([0], [1.0])
    plain.close()


def test_stale_updates_are_ignored_after_eviction():
    buf = trb(sampler=Prioritized(alpha=1.0, eps=0.0), capacity=3 * ROWS_PER_TRAJ)
    buf.add_trajectories([make_traj(i) for i in range(3)])
    old = np.arange(ROWS_PER_TRAJ)  # trajectory 0
    buf.update_priorities(np.arange(3 * ROWS_PER_TRAJ), 2.0)
    buf.add_trajectories([make_traj(3)])  # evicts trajectory 0
    assert buf.update_priorities(old, 100.0) == 0
    assert not buf.priorities(old).any()  # evicted leaves are 0
    # the stale update neither landed anywhere nor raised the priority of new rows
    new = np.arange(3 * ROWS_PER_TRAJ, 4 * ROWS_PER_TRAJ)
    buf.add_trajectories([make_traj(4)])  # new rows enter at the running max, 2.0
    live = np.arange(2 * ROWS_PER_TRAJ, 5 * ROWS_PER_TRAJ)
    assert buf.priorities(live).tolist() == [2.0] * live.size
    assert buf.update_priorities(np.concatenate([old, new]), 3.0) == new.size
    idx = np.concatenate([np_(buf.sample(500)["index"]) for _ in range(4)])
    assert idx.min() >= 2 * ROWS_PER_TRAJ  # evicted rows are never drawn
    buf.close()


def test_rows_from_every_add_path_enter_at_the_running_max(tmp_path):
    with trb(tmp_path / "src") as src:
        src.add_trajectories([make_traj(i) for i in range(2)])
        src.export(str(tmp_path / "rlinf"))
    buf = trb(tmp_path / "b", sampler=Prioritized(alpha=1.0, eps=0.0))
    buf.add_trajectories([make_traj(5)])
    buf.update_priorities([0], 7.0)
    buf.load_checkpoint(str(tmp_path / "rlinf"))  # RLinf files: a fresh tree, new rows
    index = buf.core.engine.state.index
    lo = index.low_row  # rows are never reused: the loaded ones come after row 17
    assert lo >= ROWS_PER_TRAJ and index.n_rows == lo + 36
    assert buf.priorities(np.arange(lo, lo + 36)).tolist() == [1.0] * 36
    assert buf.priorities([0]).tolist() == [0.0]  # the stale row is gone
    buf.update_priorities([lo + 3], 9.0)
    buf.add_trajectories([make_traj(7)])
    assert buf.priorities(np.arange(lo + 36, lo + 54)).tolist() == [9.0] * 18
    buf.clear()  # a cleared buffer keeps counting rows: no stale leaves, nothing reused
    buf.add_trajectories([make_traj(8)])
    new = buf.core.engine.state.index.low_row  # rows go on at the next shard boundary
    assert new >= lo + 54
    assert buf.priorities(np.arange(lo, new)).tolist() == [0.0] * (new - lo)
    assert buf.priorities(np.arange(new, new + 18)).tolist() == [1.0] * 18
    buf.close()
    rb = zreplay.ReplayBuffer(100, sampler=Prioritized(alpha=1.0, eps=0.0))
    rb.write_episode(episode(5))
    rb.update_priorities([2], 4.0)
    rb.write_episode(episode(3))
    assert rb.priorities(np.arange(8)).tolist() == [1, 1, 4, 1, 1, 4, 4, 4]
    rb.close()


def test_priorities_identical_after_close_and_reopen(tmp_path):
    path = tmp_path / "b"
    make = lambda: trb(path, sampler=Prioritized(beta_steps=50), capacity=200, seed=4)  # noqa: E731
    buf = make()
    buf.add_trajectories([make_traj(i) for i in range(15)])  # 270 rows: 90 evicted
    for _ in range(5):
        b = buf.sample(64)
        buf.update_priorities(b["index"], np.random.default_rng(0).lognormal(size=64))
    rows = np.arange(15 * ROWS_PER_TRAJ)
    leaves, total = buf.priorities(rows), _tree(buf).total
    buf.close()
    buf = make()
    assert np.array_equal(buf.priorities(rows), leaves)  # bit-identical, evicted ones 0
    assert _tree(buf).total == total and buf.core.stream.step == 5
    buf.close()
    # a second reopen from the same state draws the same batches: rng + step + tree
    draws = []
    for _ in range(2):
        shutil.copytree(path, tmp_path / f"c{len(draws)}")
        b = trb(tmp_path / f"c{len(draws)}", sampler=Prioritized(beta_steps=50), capacity=200)
        draws.append([np_(b.sample(32)["weight"]) for _ in range(3)])
        b.close()
    assert all(np.array_equal(a, c) for a, c in zip(*draws, strict=True))


def test_priorities_identical_after_checkpoint_and_load(tmp_path):
    buf = trb(tmp_path / "a", sampler=Prioritized(beta_steps=20), seed=8)
    buf.add_trajectories([make_traj(i) for i in range(6)])
    for _ in range(3):
        b = buf.sample(40)
        buf.update_priorities(b["index"], np.arange(40) / 7.0)
    buf.save_checkpoint(str(tmp_path / "ck"))
    want = [buf.sample(32) for _ in range(3)]
    leaves = buf.priorities(np.arange(6 * ROWS_PER_TRAJ))
    buf.close()
    other = trb(tmp_path / "b", sampler=Prioritized(beta_steps=20), seed=99)
    other.add_trajectories([make_traj(40)])
    other.load_checkpoint(str(tmp_path / "ck"))
    got = [other.sample(32) for _ in range(3)]
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w["index"], g["index"]) and torch.equal(w["weight"], g["weight"])
    # the checkpoint holds the leaves of save time; sampling does not change leaves
    assert np.array_equal(other.priorities(np.arange(6 * ROWS_PER_TRAJ)), leaves)
    # a rank's block keeps its rows' priorities
    ranked = trb(tmp_path / "r", sampler=Prioritized(beta_steps=20))
    ranked.load_checkpoint(str(tmp_path / "ck"), is_distributed=True, local_rank=1, world_size=2)
    block = np.arange(3 * ROWS_PER_TRAJ, 6 * ROWS_PER_TRAJ)
    assert np.array_equal(ranked.priorities(block), leaves[block])
    other.close(), ranked.close()


def test_replay_buffer_state_dict_and_reopen_keep_priorities(tmp_path):
    def make():
        return zreplay.ReplayBuffer(
            200, history_len=2, sampler=Prioritized(beta_steps=5), path=tmp_path / "rb", seed=3
        )

    rb = make()
    for k in range(5):
        rb.write_episode(episode(10 + k, base=100 * k))
    rb.update_priorities(np.arange(60), np.linspace(0.1, 3.0, 60))
    state = rb.state_dict()
    a = rb.sample(16)
    rb.update_priorities(a["index"], 50.0)  # changes what the next draw would be
    rb.load_state_dict(state)
    b = rb.sample(16)
    assert np.array_equal(a["index"], b["index"]) and np.array_equal(a["weight"], b["weight"])
    leaves = rb.priorities(np.arange(60))
    rb.close()
    rb = make()
    assert np.array_equal(rb.priorities(np.arange(60)), leaves) and rb.step == 1
    rb.close()


def test_priorities_are_a_zarr_array_beside_the_data(tmp_path):
    alpha, eps = 0.5, 1e-6
    buf = trb(tmp_path / "b", sampler=Prioritized(alpha=alpha, eps=eps))
    buf.add_trajectories([make_traj(i) for i in range(3)])
    p = np.arange(54) * 0.25
    buf.update_priorities(np.arange(54), p)
    buf.close()
    # FORMAT.md's recipe, with zarr and json only
    path, wid = str(tmp_path / "b"), "default"
    commit = json.loads((tmp_path / "b" / "segments" / wid / "zreplay" / "commit.json").read_text())
    meta = commit["sampler"].get("priority")
    lo, hi = max(meta["low"], commit["low_row"]), min(meta["high"], commit["n_rows"])
    leaves = zarr.open_array(f"{path}/segments/{wid}/priority/{meta['slot']}", mode="r")[lo:hi]
    priority = leaves ** (1 / meta["alpha"]) - meta["eps"]
    assert (lo, hi) == (0, 54) and np.array_equal(leaves, (p + eps) ** alpha)
    np.testing.assert_allclose(priority, p, atol=1e-9)
    assert zreplay.verify(tmp_path / "b").ok


def test_view_over_two_writers_keys_priorities_by_segment(tmp_path):
    path = tmp_path / "b"
    for wid, first in (("a", 0), ("b", 10)):
        with trb(path, writer_id=wid, sampler=Prioritized(alpha=1.0, eps=0.0)) as w:
            w.add_trajectories([make_traj(first + i) for i in range(2)])
            w.update_priorities(np.arange(36), 3.0 if wid == "a" else 1.0)
    view = zreplay.open(path, sampler=Prioritized(alpha=1.0, eps=0.0), seed=0)
    b = view.sample(4000)
    seg = b["index"] >> 40
    assert set(seg) == {0, 1} and np.array_equal(
        b["index"] & ((1 << 40) - 1) < 36, np.ones(4000, bool)
    )
    frac_a = (seg == 0).mean()
    assert abs(frac_a - 0.75) < 0.03  # priorities 3:1 were loaded from each writer's store
    assert np.array_equal(codes_of(b) < 100000, seg == 0)  # rows came from that segment
    assert view.update_priorities(b["index"][:2], 0.0) == 2


def test_exact_path_when_valid_clip_starts_carry_almost_no_priority():
    """Rejection keeps missing (valid starts hold ~1e-7 of the mass): the exact path
    draws among valid starts only, still proportionally to their leaves."""
    h = 18
    rb = zreplay.ReplayBuffer(100, history_len=h, sampler=Prioritized(alpha=1.0, eps=0.0), seed=2)
    rb.write_episode(episode(20))  # valid starts: steps 0, 1, 2
    p = np.full(20, 1e3)
    p[:3] = [1e-3, 2e-3, 4e-3]
    rb.update_priorities(np.arange(20), p)
    idx = np.concatenate([rb.sample(500)["index"] for _ in range(6)])
    counts = np.bincount(idx, minlength=20)
    assert counts[3:].sum() == 0
    assert chi2_stat(counts[:3], np.array([1, 2, 4]) / 7) < chi2_critical_p001(2)
    rb.close()


def test_padded_clips_before_an_episode_share_its_first_rows_priority():
    rb = zreplay.ReplayBuffer(
        100, history_len=3, pad="zero", sampler=PrioritizedClips(3, pad="zero"), seed=5
    )
    rb.write_episode(episode(5, base=10))  # clips start at steps -2 .. 2
    b = rb.sample(9000)
    s0 = (b["obs"][:, 2, 0] - 10).astype(int) - 2  # the last frame is always real
    assert np.array_equal(b["index"], np.maximum(s0, 0))
    assert np.array_equal(b["is_pad"], (s0[:, None] + np.arange(3)) < 0)
    # steps 0, 1, 2 key units with equal priority; step 0 is shared by 3 clips
    counts = np.bincount(s0 + 2, minlength=5)
    assert chi2_stat(counts, np.array([1, 1, 1, 3, 3]) / 9) < chi2_critical_p001(4)
    rb.close()


def test_verify_reports_damaged_saved_priorities(tmp_path):
    buf = trb(tmp_path / "b", sampler=Prioritized())
    buf.add_trajectories([make_traj(i) for i in range(2)])
    buf.update_priorities(np.arange(36), np.arange(36.0))
    buf.close()
    assert zreplay.verify(tmp_path / "b").ok
    seg = tmp_path / "b" / "segments" / "default"
    slot = json.loads((seg / "zreplay" / "commit.json").read_text())["sampler"]["priority"]["slot"]
    chunk = seg / "priority" / str(slot) / "c" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    report = zreplay.verify(tmp_path / "b")
    assert not report.ok and "priorities" in report.problems[0]


def test_a_prioritized_sampler_serves_one_buffer():
    shared = Prioritized()
    a = trb(sampler=shared)
    with pytest.raises(ValueError, match="its own sampler"):
        trb(sampler=shared)
    a.close()
    b = trb(sampler=shared)  # free again once its buffer is closed
    b.close()
    plain = Uniform()  # stateless samplers may be shared
    trb(sampler=plain).close(), trb(sampler=plain).close()


def test_background_commits_save_priorities_at_most_every_save_every_s(tmp_path):
    import time

    def saved_seq():
        commit = json.loads(
            (tmp_path / "b" / "segments" / "default" / "zreplay" / "commit.json").read_text()
        )
        return commit["sampler"]["priority"]["seq"], commit["n_traj"]

    buf = trb(tmp_path / "b", sampler=Prioritized(save_every_s=3600))
    buf.add_trajectories([make_traj(0)])
    buf.flush()
    assert saved_seq() == (1, 1)
    buf.update_priorities(np.arange(18), 5.0)
    buf.add_trajectories([make_traj(1)])  # a background commit: too soon to save again
    deadline = time.monotonic() + 30
    while buf.get_stats()["pending_trajectories"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert saved_seq() == (1, 2)
    buf.flush()  # flushes always save what changed
    assert saved_seq() == (2, 2)
    buf.flush()  # nothing changed: nothing written
    assert saved_seq() == (2, 2)
    buf.close()


EXIT_WITHOUT_CLOSE = """
import sys
sys.path.insert(0, {tests!r})
import zreplay
from conftest import make_traj
from zreplay.samplers import Prioritized
buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path={path!r},
                                     sampler=Prioritized())
buf.add_trajectories([make_traj(0), make_traj(1)])
b = buf.sample(16)
buf.update_priorities(b["index"], 3.0)
"""  # no close(): the interpreter's exit hook commits


def test_a_prioritized_buffer_left_open_commits_at_exit(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "b"
    script = EXIT_WITHOUT_CLOSE.format(tests=os.path.dirname(__file__), path=str(path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and "failed" not in done.stderr, done.stderr
    from zreplay.samplers import Prioritized

    with unwindowed(path, sampler=Prioritized()) as buf:  # the updated priorities were saved
        assert max(buf.priorities(range(36))) == pytest.approx((3.0 + 1e-6) ** 0.6)
    assert_exactly(path, [0, 1])


def test_priority_arrays_are_what_zarr_would_create(tmp_path):
    """Their metadata is written without zarr-python (exit hooks run after zarr's thread
    pool stopped): it must be exactly what zarr writes for the same arrays."""
    import json

    import zarr
    from zarr.codecs import Crc32cCodec, ZstdCodec

    from zreplay.store.format import PRIORITY_CHUNK_ROWS
    from zreplay.store.priority import PriorityArrays

    PriorityArrays(tmp_path / "ours", writable=True).write(0, 0, np.ones(3))
    g = zarr.open_group(tmp_path / "zarr", mode="w").require_group("priority")
    g.create_array(
        "0",
        shape=(PRIORITY_CHUNK_ROWS,),
        dtype="float64",
        chunks=(PRIORITY_CHUNK_ROWS,),
        fill_value=0.0,
        compressors=[ZstdCodec(level=1), Crc32cCodec()],
    )
    for rel in ("priority/zarr.json", "priority/0/zarr.json"):
        ours = json.loads((tmp_path / "ours" / rel).read_text())
        theirs = json.loads((tmp_path / "zarr" / rel).read_text())
        if rel.endswith("0/zarr.json"):
            ours["shape"] = theirs["shape"]  # ours grew to hold the rows written
        assert ours == theirs, rel
    read = zarr.open_array(tmp_path / "ours" / "priority" / "0", mode="r")[:3]
    np.testing.assert_array_equal(read, np.ones(3))
