"""The fork registry (zreplay.forks) and what forked children do with their parent's
buffers: real ``os.fork`` and multiprocessing 'fork' children."""

from __future__ import annotations

import atexit
import gc
import multiprocessing as mp
import os
import pickle
import sys
import threading
import time
import traceback
import weakref

import numpy as np
import pytest
from conftest import check_rows, codes_of, make_traj

import zreplay
from zreplay import forks
from zreplay.store import liveness, lock
from zreplay.store.format import lock_path
from zreplay.store.location import locate

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def in_child(fn, timeout: float = 60.0) -> int:
    """Run ``fn()`` in a forked child that ends as multiprocessing's children do (exit
    handlers, then ``os._exit``); its exit status: 0 if ``fn`` returned, 1 if it raised
    (the traceback goes to stderr), ``fn``'s own ``SystemExit`` code otherwise.  A child
    still running after ``timeout`` seconds is killed (status -9)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn()
            atexit._run_exitfuncs()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - reported as the status
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.01)


class Thing:
    def __init__(self):
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1


# -- the registry -------------------------------------------------------------------


def test_a_reset_runs_once_in_the_child_and_never_in_the_parent():
    thing = Thing()
    forks.on_fork(thing, Thing.reset)

    def child():
        assert thing.resets == 1
        assert forks.forked()

    assert in_child(child) == 0
    assert thing.resets == 0  # the parent's own object is untouched
    assert in_child(child) == 0  # a second fork: once again, in that child only


def test_resets_run_once_per_fork_in_nested_forks_too():
    """A grandchild runs the resets its grandparent registered (once per fork it went
    through: the child's and its own) and those its parent registered after forking."""
    old = Thing()
    forks.on_fork(old, Thing.reset)
    made_in_child: list[Thing] = []

    def grandchild():
        assert (old.resets, made_in_child[0].resets) == (2, 1)

    def child():
        assert old.resets == 1
        made_in_child.append(Thing())
        forks.on_fork(made_in_child[0], Thing.reset)
        assert in_child(grandchild) == 0
        assert (old.resets, made_in_child[0].resets) == (1, 0)

    assert in_child(child) == 0
    assert old.resets == 0 and not made_in_child


def test_an_object_made_after_the_fork_is_not_reset_by_it():
    def child():
        thing = Thing()
        forks.on_fork(thing, Thing.reset)
        assert thing.resets == 0

    assert in_child(child) == 0


def test_the_registry_keeps_nothing_alive_and_never_resets_a_collected_object():
    ran = []

    class Held:
        pass

    obj = Held()
    forks.on_fork(obj, lambda o: ran.append(o))
    ref = weakref.ref(obj)
    del obj
    gc.collect()
    assert ref() is None  # not kept alive by its registration

    def child():
        assert ran == []

    assert in_child(child) == 0


def test_a_reset_bound_to_its_object_is_refused():
    thing = Thing()
    with pytest.raises(TypeError, match="bound to obj"):
        forks.on_fork(thing, thing.reset)


def test_a_failing_reset_is_reported_and_the_others_still_run(monkeypatch):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    def broken(_obj):
        raise RuntimeError("this reset fails")

    first, last = Thing(), Thing()
    forks.on_fork(first, broken)
    forks.on_fork(last, Thing.reset)

    def child():
        assert last.resets == 1
        assert [str(r.exc_value) for r in reported] == ["this reset fails"]

    assert in_child(child) == 0


def test_an_origin_is_inherited_in_a_child_and_made_afresh_when_unpickled():
    origin = forks.Origin()
    assert origin.pid == os.getpid() and not origin.inherited

    def child():
        assert origin.inherited and origin.pid == os.getppid()
        again = pickle.loads(pickle.dumps(origin))
        assert not again.inherited and again.pid == os.getpid()
        fresh = forks.Origin()
        assert not fresh.inherited

    assert in_child(child) == 0
    assert not origin.inherited


def test_a_lock_a_parent_thread_held_at_the_fork_does_not_hang_the_child(bufpath):
    """The lease renewer's condition (and the lock module's other locks) held by
    another thread when the main thread forks: the child takes a writer lock anyway
    (before the registry, it waited for good on its copy of the held lock)."""
    seg = locate(bufpath) / "segments" / "w"
    seg.mkdir(parents=True)
    lock_path(seg).parent.mkdir(parents=True, exist_ok=True)
    taken, go = threading.Event(), threading.Event()

    def hold():
        with lock._RENEWER._cond:
            taken.set()
            go.wait(30)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    taken.wait(10)
    try:

        def child():
            wl = lock.WriterLock(seg)
            wl.acquire()
            assert wl.held
            wl.release()

        assert in_child(child, timeout=30) == 0
    finally:
        go.set()
        t.join()


# -- buffers in forked children ---------------------------------------------------


def _filled(path: str, n: int = 3) -> zreplay.TrajectoryReplayBuffer:
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path)
    buf.add_trajectories([make_traj(i) for i in range(n)])
    buf.flush()
    return buf


def _expected_codes(n: int = 3, T: int = 6, B: int = 3) -> set[int]:
    return {tid * 10000 + b * 100 + t for tid in range(n) for b in range(B) for t in range(T)}


@pytest.mark.filterwarnings("ignore:zreplay. reading in a forked process")
def test_a_forked_child_reads_correct_rows_of_a_view_and_a_writers_buffer(bufpath):
    """A view used in the parent (TensorStore arrays open) and the writer's buffer,
    read in a forked child: every row it reads is whole and belongs to the buffer."""
    buf = _filled(bufpath)
    view = zreplay.open(bufpath)
    want = _expected_codes()
    assert set(check_rows(view.sample(16)).tolist()) <= want  # arrays open before the fork

    def child():
        got = check_rows(view.sample(64))
        assert set(got.tolist()) <= want
        every = check_rows(view.rows(np.arange(view.num_rows)))
        assert set(every.tolist()) == want
        fresh = zreplay.open(bufpath)  # opened in the child: the same rows
        assert set(check_rows(fresh.rows(np.arange(fresh.num_rows))).tolist()) == want

    assert in_child(child) == 0
    assert set(check_rows(view.sample(16)).tolist()) <= want  # the parent's view goes on
    buf.close()


def _sample_codes(view, queue):
    try:
        queue.put(sorted(set(codes_of(view.rows(np.arange(view.num_rows))).tolist())))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put(repr(e))


@pytest.mark.filterwarnings("ignore:zreplay. reading in a forked process")
def test_a_multiprocessing_fork_child_reads_a_view_it_inherited(bufpath):
    buf = _filled(bufpath)
    view = zreplay.open(bufpath)
    view.sample(8)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_sample_codes, args=(view, queue))
    p.start()
    got = queue.get(timeout=60)
    p.join(60)
    assert got == sorted(_expected_codes()), got
    assert p.exitcode == 0
    buf.close()


def test_a_forked_child_never_touches_its_parents_lock(bufpath):
    """The child drops and closes its copy of the writer (and runs the exit handlers):
    the lock file is byte for byte the parent's, its flock still held, and the parent
    commits after the child is gone."""
    buf = _filled(bufpath, n=1)
    path = lock_path(locate(bufpath) / "segments" / "default")
    before = path.read_bytes()

    def child():
        with pytest.raises(zreplay.WriteFailedError, match="forked"):
            buf.add_trajectories([make_traj(7)])
        buf.close()
        gc.collect()

    assert in_child(child) == 0
    assert path.read_bytes() == before
    assert liveness.probe(path) is True  # the parent's flock: the child closed its copy only
    buf.add_trajectories([make_traj(1)])
    buf.close()
    assert zreplay.open(bufpath).num_trajectories == 2
    assert not path.exists()  # released by its owner at close


def test_a_forked_child_of_a_seeded_writer_draws_its_own_batches(tmp_path):
    """A child forked from a process holding a seeded writer (a fork-started DataLoader
    worker over the buffer itself) never replays its parent's next draws."""
    buf = zreplay.TrajectoryReplayBuffer(
        seed=5, auto_save=True, auto_save_path=str(tmp_path / "b"), sample_window_size=0
    )
    buf.add_trajectories([make_traj(i) for i in range(4)])
    buf.flush()
    r, w = os.pipe()

    def child():
        os.write(w, pickle.dumps(codes_of(buf.sample(32))))

    assert in_child(child) == 0
    got = pickle.loads(os.read(r, 1 << 20))
    os.close(r), os.close(w)
    mine = codes_of(buf.sample(32))
    assert len(got) == len(mine) == 32
    assert list(got) != list(mine)  # 32 draws from 72 rows: equal only if replayed
    buf.close()
