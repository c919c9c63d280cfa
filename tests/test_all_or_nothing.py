"""Every operation that changes a buffer is all or nothing: after an exception (a bad
input found late, KeyboardInterrupt, an I/O error) the buffer is as it was before or as it
would be after, in memory, after reopening and under verify.  One test per defect found
(issue 13), each failing on the code before its fix."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from conftest import check_rows, make_traj, shard_files, traj_equal

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
        tid = buf.core.next_trajectory_id
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


def _writer(path, wid, lay):
    return zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), writer_id=wid, layout=lay, sample_window_size=0
    )


def test_writers_of_a_new_buffer_cannot_fix_two_layouts(tmp_path):
    """Defect 3: two writers opened on a new buffer with different ``layout=`` each
    created arrays in their own layout while the root recorded only one; reopening the
    other segment then read its shards with the wrong chunk grid (or deleted them)."""
    path = tmp_path / "b"
    small = {"rewards": {"chunk_rows": 4, "shard_rows": 16}}
    other = {"rewards": {"chunk_rows": 8, "shard_rows": 32}}
    a, b = _writer(path, "a", small), _writer(path, "b", other)
    a.add_trajectories([make_traj(0)])
    with pytest.raises(zreplay.SchemaError, match="layout for key 'rewards'"):
        b.add_trajectories([make_traj(1)])  # refused before anything is written
    assert shard_files(path, "rewards", "b") == []
    b.close()
    a.add_trajectories([make_traj(1)])
    a.close()
    with pytest.raises(zreplay.SchemaError, match="created with"):
        _writer(path, "a", other)  # reopening with another layout is refused too
    with _writer(path, "b", small) as b:  # the recorded layout is fine
        b.add_trajectories([make_traj(2)])
    view = zreplay.open(path)
    assert view.num_trajectories == 3
    check_rows(view.sample(256))
    assert zreplay.verify(path).ok, str(zreplay.verify(path))


def test_racing_writers_of_a_new_buffer_agree_on_one_layout(tmp_path):
    path = tmp_path / "b"
    lays = [{"rewards": {"chunk_rows": 4 << i, "shard_rows": 64}} for i in range(4)]
    writers = [_writer(path, f"w{i}", lay) for i, lay in enumerate(lays)]
    go, errors = threading.Barrier(len(writers)), []

    def add(i):
        go.wait()
        try:
            writers[i].add_trajectories([make_traj(i)])
            writers[i].flush()
        except zreplay.SchemaError as e:
            errors.append(e)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in writers:
        w.close()
    assert len(errors) == len(writers) - 1  # exactly one layout won
    view = zreplay.open(path)
    assert view.num_trajectories == 1
    check_rows(view.sample(64))
    assert zreplay.verify(path).ok, str(zreplay.verify(path))


HALF_CONSUMED_DATASET = """
import sys, zreplay
it = iter(zreplay.ReplayDataset(zreplay.open(sys.argv[1]), 1024))
for _ in range(3):
    next(it)
print("done")  # exit with the iterator (and its prefetch thread) still alive
"""


@pytest.mark.slow  # a multi-process soak: python -m pytest -m slow
def test_a_half_consumed_replay_dataset_does_not_abort_the_process_at_exit(tmp_path):
    """Defect 12: the prefetch thread was still inside a TensorStore read when native
    libraries shut down (``terminate called without an active exception``, status 134,
    about 7 runs in 10 on this workload before the fix)."""
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    with persistent(tmp_path / "b") as buf:
        for _ in range(10):
            obs = rng.integers(0, 255, (50, 8, 84, 84, 3), dtype=np.uint8)
            buf.add_trajectories([{"rewards": np.ones((50, 8, 1), np.float32), "obs": obs}])
    for _ in range(6):
        done = subprocess.run(
            [sys.executable, "-c", HALF_CONSUMED_DATASET, str(tmp_path / "b")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]


def _odd_tensors():
    import torch

    base = torch.ones(4, 2, 3)
    out = {
        "meta device": lambda: torch.empty(4, 2, 3, device="meta"),
        "sparse": lambda: base.to_sparse(),
        "quantized": lambda: torch.quantize_per_tensor(base, 0.1, 0, torch.quint8),
        "nested": lambda: torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(2, 3)]),
        "neg bit": lambda: torch.ones(4, 2, 3, dtype=torch.complex64).conj().imag,
        "conj bit": lambda: torch.ones(4, 2, 3, dtype=torch.complex64).conj(),
        "bfloat16": lambda: base.to(torch.bfloat16),
    }
    if hasattr(torch, "float8_e4m3fn"):
        out["float8"] = lambda: base.to(torch.float8_e4m3fn)
    return out


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", sorted(_odd_tensors()))
def test_tensor_kinds_numpy_cannot_view_are_schema_errors(tmp_path, kind):
    """Defect 10: these escaped as NotImplementedError/TypeError/RuntimeError."""
    with persistent(tmp_path / "b") as buf:
        bad = _as_dict(0)
        bad["odd"] = _odd_tensors()[kind]()
        with pytest.raises(zreplay.SchemaError, match="'odd'"):
            buf.add_trajectories([bad])
        buf.add_trajectories([make_traj(0)])  # nothing was fixed by the refused one
    assert_exactly(tmp_path / "b", [0])


def test_a_key_path_too_long_for_the_filesystem_is_refused_before_the_schema(tmp_path):
    """Defect 10: it passed the name check, failed in the filesystem after the schema
    was written, and every later add failed."""
    deep: dict = {"leaf": np.ones((6, 3, 1), np.float32)}
    for i in range(40):
        deep = {f"level{i:02d}_" + "x" * 100: deep}
    with persistent(tmp_path / "b") as buf:
        with pytest.raises(zreplay.KeyNameError, match="shorten names or nest less"):
            buf.add_trajectories([{**_as_dict(0), "deep": deep}])
        buf.add_trajectories([make_traj(0)])
    assert_exactly(tmp_path / "b", [0])


def test_one_trajectory_not_in_a_list_is_a_clear_error(tmp_path):
    """Defect 10: add_trajectories(dict) said 'cannot add a str'."""
    with persistent(tmp_path / "b") as buf:
        for one in (_as_dict(0), make_traj(0)):
            with pytest.raises(zreplay.SchemaError, match=r"wrap it in a list"):
                buf.add_trajectories(one)
        assert len(buf) == 0


def test_close_finishes_when_a_ctrl_c_left_the_writers_lock_held(tmp_path):
    """CPython may deliver a Ctrl-C between the end of a ``with lock:`` block and its
    exit (CPython issue 29988), leaving the lock held by the interrupted thread; the
    writer's background thread then needs that lock to finish.  Adds, flushes and close
    still complete (they wait on the condition, which lets go of every hold)."""
    path = tmp_path / "b"
    result: list = []

    def interrupted_user():
        buf = persistent(path, cache_size=3, staging_bytes=0)
        buf.add_trajectories([make_traj(0)])
        buf.core.engine.cond.acquire()  # the hold such a Ctrl-C leaves behind
        for tid in range(1, 6):
            buf.add_trajectories([make_traj(tid)])
        buf.flush()
        buf.close()
        result.append(len(buf))

    user = threading.Thread(target=interrupted_user, daemon=True)
    user.start()
    user.join(60)
    assert not user.is_alive(), "close() hung on the lock a Ctrl-C left held"
    assert result == [6]
    assert_exactly(path, list(range(6)))


def test_ctrl_c_never_leaves_the_writers_lock_held():
    """CPython handles a SIGINT between two bytecodes of Python code.  ``threading.
    Condition``'s ``__enter__`` is Python code that returns after taking the lock, so a
    Ctrl-C handled there (about 1 in 1,000 interrupts of a ``with cond:`` loop on this
    machine) leaves the lock held for good and the writer's thread waits forever.  The
    writer's condition takes and releases its lock in C: no Python frame runs between
    taking it and the protected block.  Deterministically: a KeyboardInterrupt raised
    as every Python frame the ``with`` runs returns (as a SIGINT handled there would)."""
    import sys

    from zreplay.threads import InterruptSafeCondition

    def leaks(cond) -> bool:
        def local(frame, event, arg):
            if event == "return":
                raise KeyboardInterrupt
            return local

        sys.settrace(lambda frame, event, arg: local if event == "call" else None)
        try:
            with cond:
                pass
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        got: list = []

        def take():
            got.append(cond.acquire(timeout=1))
            if got[-1]:
                cond.release()

        other = threading.Thread(target=take)
        other.start()
        other.join()
        return not got[0]

    assert leaks(threading.Condition(threading.RLock()))  # the hazard is real
    assert not leaks(InterruptSafeCondition())
    cond = InterruptSafeCondition()  # and it is a condition
    woken = threading.Event()

    def waiter():
        with cond:
            cond.wait(5)
        woken.set()

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    with cond:
        cond.notify_all()
    t.join(5)
    assert woken.is_set()
