"""A hypothesis state machine over a persistent buffer, with injected I/O errors and
crashes, compared after every step with a plain in-memory model of what must be visible
(issues 13 and 20).

Rules: add (several trajectories at once, eviction by capacity), sample, flush,
close + reopen, reopen with ``overwrite=True`` (a new buffer at the same path), clear,
save_checkpoint, load_checkpoint, and add in a child process that dies at a store call.
Any rule may run with an I/O error injected at one store-layer call (:mod:`faultlib`);
then the operation must raise a clear error and leave the buffer, in memory and (after
close) on disk, as the model was before or as it would be after.  Trajectory ids only
ever grow, across clears, loads and failures (an overwrite starts a new buffer).

Meanwhile bystanders read the buffer the whole time: a thread sampling the writer
itself, a thread sampling a ``zreplay.open`` view it refreshes, and a child process
opening views afresh in a loop.  Every row they read must be whole (every field of one
transition) and belong to a trajectory that was added; an empty buffer or a closed
writer at that instant are legal answers; ``CorruptBufferError`` (or any other error)
never is: clear, load_checkpoint and overwrite are legal operations.
"""

from __future__ import annotations

import collections
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from conftest import check_rows, codes_of, make_traj, processes
from faultlib import CRASH_STATUS, Faults
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import zreplay
from zreplay.errors import BufferClosedError, EmptyBufferError, FormatError, ZReplayError
from zreplay.store.root import is_buffer

pytestmark = pytest.mark.slow  # a sweep: run by `python -m pytest -m slow` (.ci/run)

STEPS: collections.Counter = collections.Counter()  # rule -> steps run (reported at the end)
READS: collections.Counter = collections.Counter()  # bystander -> reads checked

CAPACITY = 80  # rows: a few trajectories, so adds evict
SIZES = [(2, 1), (3, 2), (6, 3), (4, 4)]  # (T, B) of the trajectories added


@dataclass(frozen=True)
class Model:
    """What must be visible: ``(trajectory id, payload)`` oldest first, where payload
    ``(code, T, B)`` is what ``make_traj(code, T, B)`` built."""

    visible: tuple = ()
    top_id: int = -1  # the highest trajectory id ever committed or handed out

    def ids(self) -> tuple:
        return tuple(t for t, _ in self.visible)

    def added(self, payloads, ids) -> Model:
        vis = list(self.visible) + list(zip(ids, payloads, strict=True))
        while sum(T * B for _, (_, T, B) in vis) > CAPACITY:
            vis.pop(0)
        return Model(tuple(vis), max(self.top_id, *ids))


def _open(path):
    return zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, capacity=CAPACITY, sample_window_size=0
    )


def _whole_rows(batch, codes_ever: set) -> int:
    """Check a batch a bystander read: whole rows of added trajectories; returns rows."""
    codes = check_rows(batch)
    bad = set(np.unique(codes // 10000).tolist()) - codes_ever
    assert not bad, f"rows of trajectories never added: {sorted(bad)}"
    return len(codes)


def _view_child(path: str, stop, out) -> None:
    """A process opening views of ``path`` afresh in a loop until ``stop`` is set; sends
    ``("ok", reads)`` or ``("error", text)``.  Codes are checked for whole rows only (the
    child does not know what was added)."""
    import traceback

    reads = 0
    try:
        while not stop.is_set():
            try:
                view = zreplay.open(path)
                if view.num_rows:
                    check_rows(view.sample(16))
                    reads += 1
            except (EmptyBufferError, FormatError):
                pass  # empty at that instant, or the path is being made again (overwrite)
            time.sleep(0.005)
        out.send(("ok", reads))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.send(("error", traceback.format_exc()))


class Bystanders:
    """Readers racing the machine's operations (see the module docstring)."""

    def __init__(self, machine):
        self.m, self.errors, self.stop = machine, [], threading.Event()
        self.threads = [
            threading.Thread(target=self._loop, args=(f, n), name=f"bystander-{n}", daemon=True)
            for f, n in ((self._sample_writer, "writer"), (self._sample_view, "view"))
        ]
        self._view = None
        ctx = processes()
        self._child_stop = ctx.Event()
        recv, send = ctx.Pipe(duplex=False)
        self._recv = recv
        self.child = ctx.Process(target=_view_child, args=(machine.path, self._child_stop, send))
        self.child.start()
        send.close()
        for t in self.threads:
            t.start()

    def _loop(self, fn, name) -> None:
        while not self.stop.is_set():
            try:
                READS[name] += fn()
            except (EmptyBufferError, BufferClosedError):
                pass  # empty, or closed for a reopen, at that instant: legal
            except BaseException:  # noqa: BLE001 - the test fails on it
                import traceback

                self.errors.append(f"{name}: {traceback.format_exc()}")
                return
            time.sleep(0.002)

    def _sample_writer(self) -> int:
        buf = self.m.buf
        if not len(buf):
            return 0
        return _whole_rows(buf.sample(16), self.m.codes_ever)

    def _sample_view(self) -> int:
        if self._view is None:
            if not is_buffer(self.m.path):
                return 0
            self._view = zreplay.open(self.m.path)
        self._view.refresh()
        if not self._view.num_rows:
            return 0
        return _whole_rows(self._view.sample(16), self.m.codes_ever)

    def check(self) -> None:
        assert not self.errors, self.errors[0]

    def close(self) -> None:
        self.stop.set()
        self._child_stop.set()
        for t in self.threads:
            t.join(30)
        got = self._recv.recv() if self._recv.poll(60) else ("error", "the child never answered")
        self.child.join(30)
        if got[0] == "error":
            self.errors.append(f"child view: {got[1]}")
        else:
            READS["child view"] += got[1]
        self.check()


def _add_in_child(path: str, payloads: list, at: int) -> None:
    with Faults(at, "crash").installed():
        buf = _open(path)
        buf.add_trajectories([make_traj(c, T, B) for c, T, B in payloads])
        buf.close()


@dataclass
class Checkpoints:
    paths: dict = field(default_factory=dict)  # name -> (path, Model saved)


class BufferMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="zreplay-sm-")
        self.path = f"{self.dir}/buf"
        self.buf = _open(self.path)
        self.model = Model()
        self.ckpts = Checkpoints()
        self.code = 0
        self.codes_ever: set[int] = set()  # payload codes ever added (bystanders check)
        self.bystanders = Bystanders(self)

    def teardown(self):
        try:
            self.bystanders.close()
        finally:
            try:
                self.buf.close()
            finally:
                shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ------------------------------------------------------------------

    def _held(self) -> tuple:
        out = []
        for i in range(len(self.buf)):
            t = self.buf.trajectory(i)
            out.append(int(t["trajectory_id"]))
        return tuple(out)

    def _payloads(self, sizes) -> list:
        out = []
        for T, B in sizes:
            self.code += 1
            out.append((self.code, T, B))
            self.codes_ever.add(self.code)
        return out

    def _run(self, op, after, fault: int | None) -> None:
        """Run ``op`` (under an I/O error at store call ``fault``).  ``after(held)``: the
        after-state, given the trajectory ids the buffer then holds (an add's new ids are
        known only then).  It succeeds and the buffer holds the after-state, or it raises
        a clear error and holds the before- or the after-state."""
        before = self.model
        try:
            if fault is None:
                op()
            else:
                with Faults(fault, "error").installed():
                    op()
        except (OSError, ZReplayError) as e:
            assert str(e)
            held = self._held()
            options = [m for m in (before, after(held)) if m is not None]
            match = [m for m in options if m.ids() == held]
            assert match, f"after {e!r}: holds {held}, neither of {[m.ids() for m in options]}"
            self.model = replace(match[-1], top_id=max(before.top_id, match[-1].top_id))
            return
        held = self._held()
        want = after(held)
        assert want is not None and held == want.ids(), f"holds {held}, not {want}"
        self.model = want

    # -- rules --------------------------------------------------------------------

    faults = st.one_of(st.none(), st.integers(1, 40), st.integers(1, 300))

    @rule(sizes=st.lists(st.sampled_from(SIZES), min_size=1, max_size=3), fault=faults)
    def add(self, sizes, fault):
        STEPS["add"] += 1
        payloads = self._payloads(sizes)
        trajs = [make_traj(c, T, B) for c, T, B in payloads]
        before = self.model

        def op():
            got = self.buf.add_trajectories(trajs)
            assert min(got) > before.top_id, f"ids {got} reused (top {before.top_id})"

        def after(held):  # the new trajectories are the last ones, with fresh ids
            new = held[-len(trajs) :]
            if len(new) < len(trajs) or min(new) <= before.top_id:
                return None
            return before.added(payloads, list(new))

        self._run(op, after, fault)

    @rule(fault=faults)
    def flush(self, fault):
        STEPS["flush"] += 1
        same = self.model
        self._run(self.buf.flush, lambda held: same, fault)

    @rule()
    def reopen(self):
        STEPS["reopen"] += 1
        self.buf.close()  # commits what is in memory
        self.buf = _open(self.path)
        assert self._held() == self.model.ids()

    @rule()
    def overwrite(self):
        """Close and start a new buffer at the same path (``overwrite=True``), as a
        restarted run does: ids start again, readers see another buffer."""
        STEPS["overwrite"] += 1
        self.buf.close()
        self.buf = zreplay.TrajectoryReplayBuffer(
            auto_save=True,
            auto_save_path=self.path,
            capacity=CAPACITY,
            sample_window_size=0,
            overwrite=True,
        )
        self.model = Model()
        assert self._held() == ()

    @rule(fault=faults)
    def clear(self, fault):
        STEPS["clear"] += 1
        emptied = Model((), self.model.top_id)
        self._run(self.buf.clear, lambda held: emptied, fault)

    @rule(name=st.sampled_from(["a", "b"]), fault=faults)
    def checkpoint(self, name, fault):
        STEPS["checkpoint"] += 1
        path = f"{self.dir}/ckpt-{name}"
        before = self.ckpts.paths.get(name)

        same = self.model
        self._run(lambda: self.buf.save_checkpoint(path), lambda held: same, fault)
        if not is_buffer(path):
            assert before is None, "a checkpoint that was there is gone"
            return
        view = zreplay.open(path)
        saved = tuple(
            int(view.trajectory(i)["trajectory_id"]) for i in range(view.num_trajectories)
        )
        options = [self.model] + ([before[1]] if before else [])
        match = [m for m in options if m.ids() == saved]
        assert match, f"checkpoint holds {saved}, not one of {[m.ids() for m in options]}"
        self.ckpts.paths[name] = (path, match[0])

    # Rules draw the same whatever happened before (no preconditions, no draws from the
    # state): a failure in a thread-timed run then replays step for step while shrinking.
    @rule(name=st.sampled_from(["a", "b"]), fault=faults)
    def load(self, name, fault):
        STEPS["load"] += 1
        if name not in self.ckpts.paths:
            return
        path, saved = self.ckpts.paths[name]
        after = Model(saved.visible, max(self.model.top_id, saved.top_id))
        self._run(lambda: self.buf.load_checkpoint(path), lambda held: after, fault)

    @rule(sizes=st.lists(st.sampled_from(SIZES), min_size=1, max_size=2), at=st.integers(1, 200))
    def add_in_a_child_that_dies(self, sizes, at):
        STEPS["add_in_a_child_that_dies"] += 1
        payloads = self._payloads(sizes)
        self.buf.close()
        p = processes().Process(target=_add_in_child, args=(self.path, payloads, at))
        p.start()
        p.join(120)
        assert p.exitcode in (0, CRASH_STATUS), p.exitcode
        self.buf = _open(self.path)
        held = self._held()
        n = len(payloads)
        after = self.model.added(payloads, list(held[-n:])) if len(held) >= n else None
        if held == self.model.ids():
            pass
        else:
            assert after is not None and held == after.ids(), f"holds {held}"
            assert min(held[-n:]) > self.model.top_id
            self.model = after

    @rule()
    def sample(self):
        STEPS["sample"] += 1
        if not self.model.visible:
            return
        codes = codes_of(self.buf.sample(32))
        payload_codes = {c for _, (c, _, _) in self.model.visible}
        assert set(np.unique(codes // 10000).tolist()) <= payload_codes

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def bystanders_read_whole_rows(self):
        self.bystanders.check()

    @invariant()
    def holds_what_the_model_says(self):
        assert self._held() == self.model.ids()
        if self.model.visible:
            i = len(self.model.visible) - 1
            got = self.buf.trajectory(i)
            c, T, B = self.model.visible[i][1]
            want = make_traj(c, T, B)
            np.testing.assert_array_equal(got["rewards"], want.rewards.numpy())


BufferMachine.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestBufferMachine = BufferMachine.TestCase


def test_report_the_steps_run():
    """Prints what the machine ran (steps per rule, rows the bystanders checked); it
    runs after the machine in this module."""
    print(f"\nstate machine steps per rule: {dict(sorted(STEPS.items()))}")
    print(f"bystander reads checked: {dict(sorted(READS.items()))}")
