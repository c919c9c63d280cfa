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


def test_an_add_waiting_for_the_writer_hears_when_its_thread_dies(tmp_path, monkeypatch):
    """An add waiting for room (uncommitted rows fill the ring) never woke up once the
    writer thread was gone."""
    import threading

    from zreplay.engine.state import SegmentState

    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(tmp_path / "b"), enable_cache=False, staging_bytes=0
    )
    buf.add_trajectories([make_traj(0)])
    buf.flush()
    real = SegmentState.set_commit

    def dies(self, commit, job=None):
        real(self, commit, job)
        if job is not None and threading.current_thread().name == "zreplay-writer":
            raise SystemExit  # nothing handles this: the thread ends

    monkeypatch.setattr(SegmentState, "set_commit", dies)
    got = []

    def add():
        try:
            for i in range(1, 8):  # soon more than the ring: the adds wait for commits
                buf.add_trajectories([make_traj(i)])
        except BaseException as e:  # noqa: BLE001 - inspected below
            got.append(e)

    t = threading.Thread(target=add)
    t.start()
    t.join(15)
    assert not t.is_alive(), "an add waited for a writer thread that is gone"
    assert isinstance(got[0], WriteFailedError) and "writer thread is gone" in str(got[0])


def test_priorities_whose_leaves_overflow_are_refused_at_the_call(tmp_path):
    """update_priorities(idx, 1e200) with alpha=2: an infinite leaf was stored and saved;
    every draw then took one row, and the reopened buffer could not sample at all."""
    buf = trb(tmp_path / "b", sampler=Prioritized(alpha=2.0, eps=0.0, save_every_s=0.0))
    buf.add_trajectories([make_traj(0)])
    with pytest.raises(ValueError, match="overflow float64"):
        buf.update_priorities(np.arange(18), 1e200)
    np.testing.assert_array_equal(buf.priorities(np.arange(18)), 1.0)  # nothing changed
    buf.close()


def test_a_missing_chunk_of_the_named_copy_is_damage_not_priority_zero(tmp_path):
    path = tmp_path / "b"
    _two_saves(path).close()
    named = _named(path)
    chunk = Path(path) / "segments/default/priority" / str(named) / "c" / "0"
    chunk.unlink()
    report = zreplay.verify(path)
    assert not report.ok and any("missing" in p for p in report.problems), report
    with pytest.warns(UserWarning, match="saved priorities cannot be read"):
        buf = trb(path)
        np.testing.assert_array_equal(buf.priorities(np.arange(54)), np.ones(54))
    buf.close()


def test_a_file_where_the_spare_copy_belongs_never_stops_the_writer(tmp_path):
    path = tmp_path / "b"
    _two_saves(path).close()
    spare = Path(path) / "segments/default/priority" / str(1 - _named(path))
    import shutil

    shutil.rmtree(spare)
    spare.write_text("not a copy")
    assert any("file stands" in w for w in zreplay.verify(path).warnings)
    buf = trb(path)
    buf.update_priorities(np.arange(54), 7.0)
    buf.add_trajectories([make_traj(3)])
    buf.close()  # every flush failed with FileExistsError, close too
    with trb(path) as again:
        assert len(again) == 4
        np.testing.assert_array_equal(again.priorities(np.arange(54)), 7.0)


def test_a_commit_in_place_despite_a_failed_directory_fsync_is_published(tmp_path, monkeypatch):
    """The record was renamed into place, then the directory's fsync failed: the commit
    was retried as unpublished, rewriting the priority copy the record on disk names."""
    import zreplay.store.backend_local as backend_local
    from zreplay.store.commit import read_commit
    from zreplay.store.location import locate
    from zreplay.store.priority import PriorityArrays

    path = tmp_path / "b"
    buf = trb(path)
    buf.add_trajectories([make_traj(0)])
    buf.update_priorities(np.arange(18), 2.0)
    buf.flush()
    seg = locate(path) / "segments" / "default"
    real_fsync, real_write, armed, bad = backend_local.fsync_dir, PriorityArrays.write, [1], []

    def fsync_fails_once(d):
        if armed and str(d).endswith("zreplay") and read_commit(seg).n_traj == 2:
            armed.pop()
            raise OSError(5, "Input/output error (injected, after the rename)")
        return real_fsync(d)

    def write(self, slot, start, leaves):
        if ((read_commit(seg).sampler or {}).get("priority") or {}).get("slot") == slot:
            bad.append(slot)
        return real_write(self, slot, start, leaves)

    monkeypatch.setattr(backend_local, "fsync_dir", fsync_fails_once)
    monkeypatch.setattr(PriorityArrays, "write", write)
    buf.update_priorities(np.arange(18), 3.0)
    buf.add_trajectories([make_traj(1)])
    buf.flush()  # published, so no error
    buf.flush()
    buf.close()
    assert not armed and not bad, f"the named copy {bad} was rewritten"
    with trb(path) as again:
        assert len(again) == 2
