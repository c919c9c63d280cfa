"""Saved priorities under damage, and the writer thread under any failure: a damaged
copy never stops the writer, ``verify`` reports damage in either copy, and whatever a
commit raises reaches the caller (never a silently dead writer thread)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import make_traj

import zreplay
from zreplay.errors import WriteFailedError
from zreplay.samplers import Prioritized


def trb(path, **kw):
    kw.setdefault("sampler", Prioritized(alpha=1.0, eps=0.0, save_every_s=0.0))
    return zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), sample_window_size=0, **kw
    )


def _commit(path) -> dict:
    return json.loads((Path(path) / "segments/default/zreplay/commit.json").read_text())


def _named(path) -> int:
    return int(_commit(path)["sampler"]["priority"]["slot"])


def _truncate_copy(path, slot: int) -> int:
    """Every file of priority copy ``slot`` cut to 0 bytes, as a power cut can leave
    files whose data never reached the disk; returns how many."""
    copy = Path(path) / "segments/default/priority" / str(slot)
    files = [p for p in copy.rglob("*") if p.is_file()]
    for p in files:
        os.truncate(p, 0)
    return len(files)


def _two_saves(path) -> zreplay.TrajectoryReplayBuffer:
    """A buffer whose priorities were saved twice (both copies written)."""
    buf = trb(path)
    buf.add_trajectories([make_traj(i) for i in range(3)])  # 54 rows
    buf.update_priorities(np.arange(54), np.arange(54) + 1.0)
    buf.flush()
    buf.update_priorities(np.arange(54), np.arange(54) + 2.0)
    buf.flush()
    return buf


def test_a_damaged_spare_copy_never_stops_the_writer(tmp_path):
    path = tmp_path / "b"
    buf = _two_saves(path)
    buf.close()
    spare = 1 - _named(path)
    assert _truncate_copy(path, spare) >= 2  # its zarr.json and a chunk
    report = zreplay.verify(path)
    assert report.ok  # the rows and the named priorities are intact ...
    assert any(f"priority copy {spare}" in w for w in report.warnings), report  # ... but said

    buf = trb(path)
    want = buf.priorities(np.arange(54))
    np.testing.assert_array_equal(want, np.arange(54) + 2.0)
    buf.update_priorities(np.arange(54), np.arange(54) + 5.0)
    buf.add_trajectories([make_traj(3)])
    buf.flush()  # saves into the damaged copy: written afresh, never read
    assert _named(path) == spare
    buf.add_trajectories([make_traj(4)])
    buf.close()

    buf = trb(path)
    assert len(buf) == 5  # every add after the damage is there
    np.testing.assert_array_equal(buf.priorities(np.arange(54)), np.arange(54) + 5.0)
    buf.close()
    assert zreplay.verify(path).ok and not zreplay.verify(path).warnings


def test_a_damaged_named_copy_restarts_the_priorities_and_the_writer_goes_on(tmp_path):
    path = tmp_path / "b"
    _two_saves(path).close()
    named = _named(path)
    _truncate_copy(path, named)
    report = zreplay.verify(path)
    assert not report.ok and any("priorities" in p for p in report.problems), report

    with pytest.warns(UserWarning, match="saved priorities cannot be read"):
        buf = trb(path)
        buf.add_trajectories([make_traj(3)])
        buf.flush()  # the committer restores the tree: the damage must not kill it
    assert _named(path) != named  # this save named the other copy
    np.testing.assert_array_equal(buf.priorities(np.arange(54)), np.ones(54))  # afresh
    buf.add_trajectories([make_traj(4)])
    buf.flush()
    buf.close()
    buf = trb(path)
    assert len(buf) == 5
    buf.close()
    assert zreplay.verify(path).ok


class _Boom(RuntimeError):
    pass


def test_whatever_building_a_commit_raises_reaches_the_caller_and_is_retried(tmp_path):
    buf = trb(tmp_path / "b")
    sampler = buf.sampler
    real = sampler.snapshot
    broken = {"now": True}

    def failing(*a, **kw):
        if broken["now"]:  # every commit built while it is set (background and retries)
            raise _Boom("injected while the commit was built")
        return real(*a, **kw)

    sampler.snapshot = failing
    buf.add_trajectories([make_traj(0)])
    with pytest.raises(WriteFailedError, match="injected while the commit was built"):
        buf.flush()
    broken["now"] = False
    buf.flush()  # retried: the thread is alive and commits
    buf.add_trajectories([make_traj(1)])
    buf.close()
    with trb(tmp_path / "b") as again:
        assert len(again) == 2


def test_an_add_never_returns_once_the_writer_thread_is_gone(tmp_path):
    buf = trb(tmp_path / "b")
    buf.add_trajectories([make_traj(0)])
    buf.flush()
    committer = buf.core.engine._committer
    with committer.cond:  # the thread dies as an interpreter shutdown would kill it
        committer.dead = SystemExit()
        committer.stopping = True
        committer.cond.notify_all()
    committer.thread.join(5)
    committer.stopping = False
    with pytest.raises(WriteFailedError, match="writer thread is gone"):
        buf.add_trajectories([make_traj(1)])
    with pytest.raises(WriteFailedError, match="writer thread is gone"):
        buf.flush()
