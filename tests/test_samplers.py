"""Samplers through the three entry points: every sampler from every entry point, Window =
RLinf's window, Recency's preference, empty buffers, and a crash between a priority write
and its commit (kept here with the other kill tests' bodies; the rest of priorities:
test_priorities.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import zarr
from conftest import check_rows, codes_of, make_traj
from test_sumtree import chi2_critical_p001, chi2_stat

import zreplay
from zreplay.errors import EmptyBufferError
from zreplay.samplers import Prioritized, PrioritizedClips, Recency, Staleness, Uniform, Window


def trb(path=None, **kw) -> zreplay.TrajectoryReplayBuffer:
    if path is None:
        return zreplay.TrajectoryReplayBuffer(**kw)
    return zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), **kw)


def row_code(row: np.ndarray, T: int = 6, B: int = 3) -> np.ndarray:
    """conftest's code of global row ``row`` when every trajectory is [T, B] (env-major)."""
    tid, rel = np.divmod(row, T * B)
    b, t = np.divmod(rel, T)
    return tid * 10000 + b * 100 + t


def episode(L: int, base: float = 0.0) -> dict:
    return {
        "obs": (base + np.arange(L, dtype=np.float32))[:, None],
        "action": np.ones((L, 2), np.float32),
        "reward": np.ones(L, np.float32),
    }


def np_(x) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


# -- every sampler from every entry point --------------------------------------------


def hook(step, buffer, batch_size, history_len):
    total = buffer.num_valid_ends(history_len) if hasattr(buffer, "num_valid_ends") else None
    if total is None:
        total = buffer.total_samples if hasattr(buffer, "total_samples") else buffer.num_rows
    return (np.arange(batch_size) + step) % total


SAMPLERS = {
    "uniform": lambda: Uniform(),
    "window": lambda: Window(2),
    "recency": lambda: Recency(1.5),
    "prioritized": lambda: Prioritized(),
    "prioritized_clips": lambda: PrioritizedClips(3),
    "staleness": lambda: Staleness(3),
    "hook": lambda: hook,
}


@pytest.mark.parametrize("name", list(SAMPLERS))
@pytest.mark.parametrize("entry", ["rlinf", "swm", "view"])
def test_every_sampler_from_every_entry_point(tmp_path, name, entry):
    sampler = SAMPLERS[name]()
    prioritized = name.startswith("prioritized")
    if entry == "swm":
        buf = zreplay.ReplayBuffer(200, history_len=3, sampler=sampler, seed=0)
        for k in range(5):
            ep = episode(8 + k, base=100 * k)
            ep["versions"] = np.full(8 + k, k, np.float32)  # Staleness reads them
            buf.write_episode(ep)
        batch = buf.sample(16)
        assert batch["obs"].shape == (16, 3, 1)
        assert np.all(np.diff(batch["obs"][:, :, 0], axis=1) == 1)  # inside one episode
        nstep = buf.sample_nstep(8, n=2)
    else:
        writer = trb(tmp_path / "b", sampler=sampler if entry == "rlinf" else None, seed=0)
        writer.add_trajectories([make_traj(i) for i in range(5)])
        writer.flush()
        buf = writer if entry == "rlinf" else zreplay.open(tmp_path / "b", seed=0, sampler=sampler)
        batch = buf.sample(16)
        if name == "prioritized_clips":
            a = np_(batch["actions"])
            assert a.shape[:2] == (16, 3) and np.all(np.diff(a[:, :, 0], axis=1) == 1)
        else:
            codes = check_rows(batch)
            if name == "window":
                assert set(codes // 10000) <= {3, 4}
        clips = buf.sample_clips(8, 2)
        assert np_(clips["rewards"]).shape[:2] == (8, 2)
        nstep = buf.sample_nstep(8, n=2, reward_key="versions")
    assert ("index" in batch and "weight" in batch) == prioritized
    assert ("index" in nstep) == prioritized
    if prioritized:
        assert buf.update_priorities(batch["index"], np.ones(16)) == 16
        assert buf.update_priorities(nstep["index"], 2.0) == 8
    if entry == "view":
        writer.close()
    else:
        buf.close()


# -- Window and Recency --------------------------------------------------------------


def test_window_is_rlinfs_window(tmp_path):
    trajs = [make_traj(i) for i in range(7)]
    draws = []
    for kw in ({"sample_window_size": 3}, {"sampler": Window(3)}):
        buf = trb(seed=21, **kw)
        buf.add_trajectories(trajs)
        draws.append(np.concatenate([codes_of(buf.sample(100)) for _ in range(3)]))
        buf.close()
    assert np.array_equal(draws[0], draws[1])
    # RLinf: rows drawn uniformly with replacement from the last N trajectories' rows
    rng = np.random.Generator(np.random.PCG64(21))
    want = np.concatenate([rng.integers(4 * 18, 7 * 18, size=100) for _ in range(3)])
    assert np.array_equal(draws[0], row_code(want))
    buf = trb(seed=21, sample_window_size=3)
    assert isinstance(buf.sampler, Window) and buf.sampler.size == 3
    buf.add_trajectories(trajs)
    buf.sample_window_size = 0  # RLinf's attribute still resizes the window
    assert set(codes_of(buf.sample(3000)) // 10000) == set(range(7))
    with pytest.raises(ValueError, match=">= 0"):
        Window(-1)
    buf.close()


def test_recency_draws_recent_trajectories_more_often():
    half_life = 1.5
    buf = trb(sampler=Recency(half_life), seed=3)
    buf.add_trajectories([make_traj(i) for i in range(8)])  # equal sizes
    tid = np.concatenate([codes_of(buf.sample(2000)) // 10000 for _ in range(10)])
    counts = np.bincount(tid, minlength=8)
    probs = 2.0 ** (-(7 - np.arange(8)) / half_life)
    probs /= probs.sum()
    assert np.all(np.diff(counts) > 0)  # strictly more often the newer
    assert chi2_stat(counts, probs) < chi2_critical_p001(7)
    assert chi2_stat(counts, np.full(8, 1 / 8)) > chi2_critical_p001(7)
    buf.close()
    # episodes (one trajectory each): clips follow their episode's age
    rb = zreplay.ReplayBuffer(1000, history_len=2, sampler=Recency(1.0), seed=4)
    for k in range(4):
        rb.write_episode(episode(6, base=100 * k))
    ep = np.concatenate([rb.sample(1000)["obs"][:, 0, 0] // 100 for _ in range(8)]).astype(int)
    probs = 2.0 ** -(3 - np.arange(4.0))
    assert chi2_stat(np.bincount(ep, minlength=4), probs / probs.sum()) < chi2_critical_p001(3)
    rb.close()


def test_empty_buffers_raise_for_every_sampler():
    for make in SAMPLERS.values():
        buf = trb(sampler=make())
        with pytest.raises(EmptyBufferError):
            buf.sample(2)
        buf.close()


_CRASH_CHILD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from conftest import make_traj
    import zreplay
    from zreplay.engine import committer
    from zreplay.samplers import Prioritized

    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path={path!r},
                                         sampler=Prioritized(alpha=1.0, eps=0.0))
    buf.add_trajectories([make_traj(i) for i in range(3)])
    buf.update_priorities(np.arange(54), 2.0)
    buf.flush()  # published: every leaf 2.0
    buf.update_priorities(np.arange(54), 5.0)
    def crash(*a, **k):  # the new copy is written; die before the commit names it
        os._exit(9)
    committer.write_commit = crash
    buf.flush()
    """
)


def test_crash_between_priority_write_and_commit_keeps_the_named_copy(tmp_path):
    path = str(tmp_path / "b")
    code = _CRASH_CHILD.format(tests=os.path.dirname(__file__), path=path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    assert proc.returncode == 9, proc.stderr.decode()[-2000:]
    seg = tmp_path / "b" / "segments" / "default"
    slot = json.loads((seg / "zreplay" / "commit.json").read_text())["sampler"]["priority"]["slot"]
    other = zarr.open_array(str(seg / "priority" / str(1 - slot)), mode="r")[:54]
    assert (other == 5.0).all()  # the unpublished copy was written before the crash
    buf = trb(path, sampler=Prioritized(alpha=1.0, eps=0.0))
    assert buf.priorities(np.arange(54)).tolist() == [2.0] * 54
    buf.close()
