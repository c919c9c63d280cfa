"""Every operation that changes a buffer is all or nothing: after an exception (a bad
input found late, KeyboardInterrupt, an I/O error) the buffer is as it was before or as it
would be after, in memory, after reopening and under verify.  One test per defect found
(issue 13), each failing on the code before its fix.  This file keeps the add, Ctrl-C and
kill -9 ones; those of load, clear, priorities, locks, layouts and bad input live in their
concept files (tests/README.md)."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from conftest import check_rows, make_traj, traj_equal

import zreplay
from zreplay.engine import ramtier


def persistent(path, **kw):
    kw.setdefault("sample_window_size", 0)
    return zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), **kw)


def assert_exactly(path, tids: list[int]) -> None:
    """The buffer at ``path`` holds exactly trajectories ``tids`` (ids and data), sampled
    rows are whole, it reopens, and verify finds nothing."""
    with persistent(path) as buf:
        assert len(buf) == len(tids)
        for i, tid in enumerate(tids):
            got = buf.trajectory(i)
            assert got["trajectory_id"] == tid
            traj_equal(got, make_traj(tid))
        check_rows(buf.sample(512))
    assert zreplay.verify(path).ok, str(zreplay.verify(path))


def _as_dict(tid, **extra):
    return {**make_traj(tid, as_dict=True), **extra}


def _fail_second_copy(exc):
    calls = [0]
    write = ramtier.RamTier.write_trajectory

    def patched(self, *a, **kw):
        calls[0] += 1
        if calls[0] == 2:
            write(self, *a, **kw)  # the copy happens, then the failure
            raise exc
        return write(self, *a, **kw)

    return patched


@pytest.mark.parametrize(
    "case",
    [
        "max_episode_length overflows int64",
        "masked array",
        "error while copying the batch's second trajectory",
        "KeyboardInterrupt while copying the batch's second trajectory",
    ],
)
def test_a_failed_add_adds_nothing_and_later_adds_are_indexed_right(tmp_path, monkeypatch, case):
    path = tmp_path / "b"
    buf = persistent(path, cache_size=2)
    buf.add_trajectories([make_traj(0), make_traj(1)])
    if case == "max_episode_length overflows int64":
        batch, exc = [_as_dict(2, max_episode_length=2**63)], zreplay.SchemaError
    elif case == "masked array":
        bad = _as_dict(2)
        bad["rewards"] = np.ma.masked_array(bad["rewards"].numpy(), mask=False)
        batch, exc = [make_traj(2), bad], zreplay.SchemaError
    else:
        err = RuntimeError("copy failed") if case.startswith("error") else KeyboardInterrupt()
        monkeypatch.setattr(ramtier.RamTier, "write_trajectory", _fail_second_copy(err))
        batch, exc = [make_traj(2), make_traj(3)], type(err)
    with pytest.raises(exc):
        buf.add_trajectories(batch)
    monkeypatch.undo()
    assert len(buf) == 2  # not even the batch's first trajectory
    assert buf.add_trajectories([make_traj(2), make_traj(3)]) == [2, 3]
    check_rows(buf.sample(512))
    buf.close()
    assert_exactly(path, [0, 1, 2, 3])


def test_ctrl_c_at_random_moments_of_large_adds_never_corrupts(tmp_path):
    """Real SIGINTs (a notebook user pressing Ctrl-C, then going on) land anywhere in
    add_trajectories; whatever each interrupted add did, it added all or nothing."""
    # Python's own Ctrl-C handler, as in a notebook: a process started in the background
    # by a non-interactive shell inherits SIGINT ignored, and would never be interrupted.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_adds(tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_adds(tmp_path) -> None:
    path = tmp_path / "b"
    # No staging budget: the add copies, splits and waits for room, so it lasts long
    # enough on a loaded machine for the timer thread to fire inside it.
    buf = persistent(path, cache_size=3, staging_bytes=0)
    rng = np.random.default_rng(0)
    big = make_traj(0, T=40, B=64)  # 2,560 rows
    took = []
    for tid in range(4):  # how long an add takes here, uninterrupted
        t0 = time.perf_counter()
        buf.add_trajectories([make_traj(tid), big])
        took.append(time.perf_counter() - t0)
    added, tid, interrupted = [0, None, 1, None, 2, None, 3, None], 8, 0
    for _ in range(60):
        delay = float(rng.uniform(0, 1.5 * np.median(took)))
        timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
        before = len(buf)
        try:
            timer.start()
            buf.add_trajectories([make_traj(tid), big])
            time.sleep(1.5 * np.median(took))  # the timer may fire after the add: here
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            timer.cancel()
            timer.join()
        got = len(buf) - before
        assert got in (0, 2)
        if got:
            added += [tid, None]
        tid = buf.core.engine.next_trajectory_id
    assert interrupted > 5 and len(added) > 8  # some adds were cut short, some went through
    check_rows(buf.sample(2048))
    buf.close()
    with persistent(path) as again:
        assert len(again) == len(added)
        check_rows(again.sample(2048))
    assert zreplay.verify(path).ok


# -- load_checkpoint (defect 5) ----------------------------------------------------------


def _load_and_die(path: str, ckpt: str, at: int) -> None:
    """Load ``ckpt`` into the buffer at ``path`` and die (os._exit) at the ``at``-th
    file operation of the replacement (a hard link, a move, a commit or intent write)."""
    from zreplay.store import backend_local

    calls = [0]

    def dying(fn):
        def wrapped(*a, **kw):
            calls[0] += 1
            if calls[0] == at:
                os._exit(9)
            return fn(*a, **kw)

        return wrapped

    B = backend_local.LocalBackend
    for name in ("import_file", "move_tree", "publish", "remove_tree"):
        setattr(B, name, dying(getattr(B, name)))
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path)
    buf.load_checkpoint(ckpt)
    os._exit(0)


def test_kill_9_while_loading_a_checkpoint_leaves_old_or_new(tmp_path):
    from conftest import processes

    with persistent(tmp_path / "src") as src:
        src.add_trajectories([make_traj(t) for t in (20, 21, 22)])
        src.save_checkpoint(str(tmp_path / "ck"))
    ctx, outcomes = processes(), set()
    for at in range(1, 200, 5):
        path = tmp_path / f"b{at}"
        with persistent(path) as buf:
            buf.add_trajectories([make_traj(0), make_traj(1)])
        p = ctx.Process(target=_load_and_die, args=(str(path), str(tmp_path / "ck"), at))
        p.start()
        p.join(60)
        with persistent(path) as buf:  # the next writer finishes or drops the replacement
            codes = [int(buf.trajectory(i)["actions"][0, 0, 0]) // 10000 for i in range(len(buf))]
            assert codes in ([0, 1], [20, 21, 22]), (at, codes)
            outcomes.add(tuple(codes))
            check_rows(buf.sample(256))
            tid = buf.add_trajectories([make_traj(7)])[0]  # arrays of the right dtype/shape
            check_rows(buf.sample(256))
            traj_equal(buf.trajectory(-1), make_traj(7))
        assert tid == len(codes) and zreplay.verify(path).ok, (at, str(zreplay.verify(path)))
        if p.exitcode == 0:  # got through without dying
            break
    assert outcomes == {(0, 1), (20, 21, 22)}, outcomes


# -- clear (defect 6) --------------------------------------------------------------------


def _clear_and_die(path: str, conn) -> None:
    from zreplay.store import root

    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path, seed=3)
    buf.add_trajectories([make_traj(0), make_traj(1)])
    buf.sample(10)
    buf.flush()
    conn.send(buf.core.stream.state()["rng"])

    def remove(self, writer_id):  # the clear's commit is published: die deleting arrays
        self.backend.remove_tree(self.segment_dir(writer_id) / "data")
        os._exit(9)

    root.BufferRoot.remove_segment_data = remove
    buf.clear()


def test_kill_9_during_clear_keeps_ids_and_the_random_stream(tmp_path):
    from conftest import processes

    ctx = processes()
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_clear_and_die, args=(str(tmp_path / "b"), send))
    p.start()
    rng = recv.recv()
    p.join(60)
    assert p.exitcode == 9
    with persistent(tmp_path / "b") as buf:
        assert len(buf) == 0 and buf.core.stream.state()["rng"] == rng
        assert buf.add_trajectories([make_traj(2)]) == [2]
    assert_exactly(tmp_path / "b", [2])
