"""A hypothesis state machine over a persistent buffer, with injected I/O errors and
crashes, compared after every step with a plain in-memory model of what must be visible
(issue 13).

Rules: add (several trajectories at once, eviction by capacity), sample, flush,
close + reopen, clear, save_checkpoint, load_checkpoint, and add in a child process that
dies at a store call.  Any rule may run with an I/O error injected at one store-layer call
(:mod:`faultlib`); then the operation must raise a clear error and leave the buffer, in
memory and (after close) on disk, as the model was before or as it would be after.
Trajectory ids only ever grow, across clears, loads and failures.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field, replace

import numpy as np
from conftest import codes_of, make_traj, processes
from faultlib import CRASH_STATUS, Faults
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import zreplay
from zreplay.errors import ZReplayError
from zreplay.store.root import is_buffer

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

    def teardown(self):
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
        same = self.model
        self._run(self.buf.flush, lambda held: same, fault)

    @rule()
    def reopen(self):
        self.buf.close()  # commits what is in memory
        self.buf = _open(self.path)
        assert self._held() == self.model.ids()

    @rule(fault=faults)
    def clear(self, fault):
        emptied = Model((), self.model.top_id)
        self._run(self.buf.clear, lambda held: emptied, fault)

    @rule(name=st.sampled_from(["a", "b"]), fault=faults)
    def checkpoint(self, name, fault):
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
        if name not in self.ckpts.paths:
            return
        path, saved = self.ckpts.paths[name]
        after = Model(saved.visible, max(self.model.top_id, saved.top_id))
        self._run(lambda: self.buf.load_checkpoint(path), lambda held: after, fault)

    @rule(sizes=st.lists(st.sampled_from(SIZES), min_size=1, max_size=2), at=st.integers(1, 200))
    def add_in_a_child_that_dies(self, sizes, at):
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
        if not self.model.visible:
            return
        codes = codes_of(self.buf.sample(32))
        payload_codes = {c for _, (c, _, _) in self.model.visible}
        assert set(np.unique(codes // 10000).tolist()) <= payload_codes

    # -- invariants -----------------------------------------------------------------

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
