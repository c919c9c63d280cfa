"""How deep a sample goes: zreplay frames between a facade's ``sample`` and the array read.

The read path is kept short on purpose (issue 34: "a sample reaches the data in at most 5
zreplay frames"); these tests count frames, not time, so a layer that only passes a call
through fails them wherever it is added back.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import zreplay
from zreplay import ReplayBuffer, TrajectoryReplayBuffer
from zreplay.engine.colcache import ColumnCache
from zreplay.engine.ramtier import RamTier

SRC = str(Path(zreplay.__file__).resolve().parent)


def _ours(frame) -> bool:
    return frame.f_code.co_filename.startswith(SRC)


def _names(frame) -> list[str]:
    """The zreplay frames on the stack from ``frame`` up, outermost first."""
    out = []
    while frame is not None:
        if _ours(frame):
            out.append(f"{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_name}")
        frame = frame.f_back
    return out[::-1]


def _trajectory(t=50, b=4, first=0):
    """Row values that name the row: obs ``first + 8k .. first + 8k + 7``, and actions and
    rewards hold obs[0] (a read mixing rows across keys shows)."""
    obs = (first + np.arange(t * b * 8, dtype=np.float32)).reshape(t, b, 8)
    return {
        "obs": obs,
        "actions": np.repeat(obs[..., :1], 2, axis=-1),
        "rewards": obs[..., 0].copy(),
        "dones": np.zeros((t, b), bool),
    }


def _stacks_at_reads(monkeypatch, sample) -> list[list[str]]:
    """The zreplay frames down to each array read (a RAM tier's or a column cache's
    ``gather``, itself included) during ``sample()``."""
    stacks = []
    for cls in (RamTier, ColumnCache):
        real = cls.gather

        def spy(self, *a, _real=real, **kw):
            stacks.append([*_names(sys._getframe(1)), f"{_real.__module__}.gather"])
            return _real(self, *a, **kw)

        monkeypatch.setattr(cls, "gather", spy)
    sample()
    monkeypatch.undo()
    return stacks


def _deepest(sample) -> list[str]:
    """The deepest stack of zreplay frames any call reached during ``sample()`` (as
    benchmarks/bench_inside.py counts)."""
    deepest: list[str] = []

    def hook(frame, event, _arg):
        nonlocal deepest
        if event == "call" and _ours(frame):
            names = _names(frame)
            if len(names) > len(deepest):
                deepest = names

    sys.setprofile(hook)
    try:
        sample()
    finally:
        sys.setprofile(None)
    return deepest


@pytest.fixture
def rlinf(tmp_path):
    rb = TrajectoryReplayBuffer(
        seed=0, auto_save=True, auto_save_path=str(tmp_path / "rl"), sample_window_size=0
    )
    rb.add_trajectories([_trajectory(), _trajectory(first=1600)])
    rb.flush()
    rb.sample(8)  # what is built once per add (the snapshot's row space) is built
    yield rb
    rb.close()


def test_rlinf_sample_reaches_the_ram_tier_in_five_frames(rlinf, monkeypatch):
    stacks = _stacks_at_reads(monkeypatch, lambda: rlinf.sample(256))
    assert len(stacks) == 4  # one fancy index per key
    for stack in stacks:
        assert stack[0] == "trajectory_buffer.sample"
        assert stack[-1] == "zreplay.engine.ramtier.gather"
        assert len(stack) <= 5, " > ".join(stack)
    deepest = _deepest(lambda: rlinf.sample(256))
    assert len(deepest) <= 5, " > ".join(deepest)


def test_view_sample_reaches_the_column_cache_in_five_frames(rlinf, monkeypatch):
    view = zreplay.open(rlinf.path)
    try:
        view.sample(8)  # the first sample fills the column cache
        stacks = _stacks_at_reads(monkeypatch, lambda: view.sample(256))
        assert len(stacks) == 4
        for stack in stacks:
            assert stack[0] == "view.sample"
            assert stack[-1] == "zreplay.engine.colcache.gather"
            assert len(stack) <= 5, " > ".join(stack)
        deepest = _deepest(lambda: view.sample(256))
        assert len(deepest) <= 5, " > ".join(deepest)
    finally:
        view.close()


def _check_rows(batch: dict, stored_obs: np.ndarray) -> None:
    obs = np.asarray(batch["obs"])
    assert np.array_equal(obs[:, 1:] - obs[:, :1], np.tile(np.arange(1, 8), (len(obs), 1)))
    assert np.isin(obs[:, 0], stored_obs[:, 0]).all()
    assert np.array_equal(np.asarray(batch["actions"]), np.repeat(obs[:, :1], 2, axis=1))
    assert np.array_equal(np.asarray(batch["rewards"]), obs[:, 0])


def test_rows_read_on_the_short_path_are_the_stored_rows(rlinf):
    """The short path reads what is stored: whole rows, every key of the same row."""
    view = zreplay.open(rlinf.path)
    try:
        stored = view.rows(np.arange(view.num_rows))["obs"]
        assert len(np.unique(stored[:, 0])) == view.num_rows == 400
        _check_rows(rlinf.sample(256), stored)
        view.sample(1)
        _check_rows(view.sample(256), stored)
    finally:
        view.close()


def test_stable_worldmodel_sample_reaches_the_ram_tier(tmp_path, monkeypatch):
    swm = ReplayBuffer(100_000, path=str(tmp_path / "swm"), history_len=1)
    ep = {"obs": np.zeros((50, 8), np.float32), "action": np.zeros((50, 2), np.float32)}
    swm.write_episodes([ep, ep])
    swm.flush()
    swm.sample(8)
    try:
        stacks = _stacks_at_reads(monkeypatch, lambda: swm.sample(256))
        assert len(stacks) == 2
        for stack in stacks:
            assert stack[0] == "episode_buffer.sample"
            assert stack[-1] == "zreplay.engine.ramtier.gather"
            assert len(stack) <= 5, " > ".join(stack)
    finally:
        swm.close()


def test_the_short_path_gathers_into_the_callers_arrays(rlinf):
    """With ``alloc`` (pinned memory, where CUDA is), RAM-tier rows land in the arrays it
    gave, and they are the rows a sample without it reads."""
    given = {}

    def alloc(name, shape, dtype):
        given[name] = np.full(shape, -1, dtype)
        return given[name]

    got = rlinf.core.sample(64, alloc=alloc)
    assert set(given) == {"obs", "actions", "rewards", "dones"}
    for name, arr in got.items():
        assert arr is given[name]
    view = zreplay.open(rlinf.path)
    try:
        _check_rows(got, view.rows(np.arange(view.num_rows))["obs"])
    finally:
        view.close()


def test_rows_whose_cache_slots_were_reused_meanwhile_are_read_from_the_store(rlinf, monkeypatch):
    """When another process reuses the column cache's slots during a view's gather (its
    ``lo`` moved past the rows), the short path reads those rows from the store instead."""
    view = zreplay.open(rlinf.path)
    try:
        stored = view.rows(np.arange(view.num_rows))["obs"]
        view.sample(1)
        real = ColumnCache.gather

        def reused(self, key, slots, out=None):
            return np.zeros_like(real(self, key, slots, out))  # what reused slots hold

        monkeypatch.setattr(ColumnCache, "gather", reused)
        monkeypatch.setattr(ColumnCache, "kept", lambda self, lo: False)
        _check_rows(view.sample(256), stored)
    finally:
        view.close()
