"""Opening a buffer interrupted at any point: a creation killed part way is finished by
the next writer (and reported by ``verify`` until then); a Ctrl-C in the first open (which
imports TensorStore) can be retried."""

from __future__ import annotations

import dis
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import zarr
from conftest import processes
from faultlib import CRASH_STATUS, Faults, budget, injection_points

import zreplay
from zreplay.store import liveness


def _traj(i: int) -> dict:
    return {"obs": np.full((4, 2, 3), i, np.float32), "rewards": np.zeros((4, 2), np.float32)}


def _create(path: str) -> None:
    zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path).close()


def _create_killed_at(path: str, at: int) -> None:
    with Faults(at, "crash").installed():
        _create(path)


@pytest.mark.slow  # about 30 s: a kill at each of the creation's store calls
def test_a_creation_killed_at_any_write_is_finished_by_the_next_writer(tmp_path):
    with Faults().installed() as count:
        _create(str(tmp_path / "count"))
    assert count.calls > 5
    ctx = processes()
    for at in range(1, count.calls + 1):
        path = str(tmp_path / f"b{at}")
        p = ctx.Process(target=_create_killed_at, args=(path, at))
        p.start()
        p.join(120)
        assert p.exitcode == CRASH_STATUS, f"call {at}: exit code {p.exitcode}"
        root_made = os.path.isfile(os.path.join(path, "zarr.json"))
        unfinished = not all(
            os.path.isfile(os.path.join(path, *rel, "zarr.json"))
            for rel in [("segments",), ("zreplay",)]
        )
        if root_made:
            report = zreplay.verify(path)
            assert report.ok != unfinished, f"call {at}: {report}"
            if unfinished:
                assert "creation was interrupted" in str(report), f"call {at}: {report}"
        with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buf:
            buf.add_trajectories([_traj(1), _traj(2)])
            buf.save_checkpoint(str(tmp_path / f"ckpt{at}"))
        assert zreplay.verify(path).ok, f"call {at}: {zreplay.verify(path)}"
        group = zarr.open_group(path, mode="r")
        assert {name for name, _ in group.members()} >= {"segments", "zreplay"}, f"call {at}"
        assert zreplay.open(path).num_trajectories == 2, f"call {at}"
        assert zreplay.open(str(tmp_path / f"ckpt{at}")).num_trajectories == 2, f"call {at}"


def test_only_temp_files_of_dead_writers_are_removed_from_the_root(tmp_path):
    """The root's shared files take no segment lock: a temp file there goes when the
    next writer opens only if the process that wrote it is dead."""
    path = tmp_path / "buf"
    _create(str(path))
    ctx = processes()
    p = ctx.Process(target=_create_killed_at, args=(str(tmp_path / "probe"), 10**9))
    p.start()
    p.join(60)
    dead_pid = p.pid  # exited: its tag names a dead process of this kernel
    tag = liveness.process_tag().replace(".", "_")
    live = path / f"zarr.json.{tag}.0123abcd.tmp"
    dead = path / f"zarr.json.{tag.rsplit('-', 1)[0]}-{dead_pid}.0123abcd.tmp"
    foreign = path / "segments" / "zarr.json.otherhost-ffffffffffffffff-1.0123abcd.tmp"
    for f in (live, dead, foreign):
        f.write_bytes(b"{}")
    _create(str(path))
    assert live.exists() and foreign.exists() and not dead.exists()


# A SIGINT arrives while TensorStore's native module initialises (it imports ml_dtypes
# from there): the moment a notebook user's Ctrl-C lands in the first open.
INTERRUPTED_IMPORT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import zreplay
    assert "tensorstore" not in sys.modules

    class Interrupt:
        fired = False
        def find_spec(self, name, path=None, target=None):
            if name == "ml_dtypes" and not Interrupt.fired:
                Interrupt.fired = True
                os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.meta_path.insert(0, Interrupt())
    path = sys.argv[1]
    traj = {"obs": np.zeros((4, 2, 3), np.float32), "rewards": np.zeros((4, 2), np.float32)}
    try:
        with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buf:
            buf.add_trajectories([traj])
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    assert Interrupt.fired
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buf:
        buf.add_trajectories([traj])
    print("retried", zreplay.open(path).num_trajectories, flush=True)
    """
)


def test_a_ctrl_c_in_the_first_open_can_be_retried(tmp_path):
    got = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IMPORT, str(tmp_path / "buf")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stdout + got.stderr
    assert got.stdout.split() == ["interrupted", "retried", "1"], got.stdout + got.stderr


# -- Ctrl-C at every line of an open and of a clear --------------------------------------


_LOAD_CONST = dis.opmap["LOAD_CONST"]
_CALLS = {dis.opmap["CALL"], dis.opmap.get("PRECALL", dis.opmap["CALL"])}


def _at_with_exit(frame) -> bool:
    """Whether ``frame`` is at the call of a ``with`` block's ``__exit__(None, None,
    None)`` (a line event of the ``with`` line, after its block).  No signal is handled
    there (the eval loop checks for them at function entries and backward jumps), so
    no Ctrl-C lands between the block's end and its exit."""
    code, i = frame.f_code, frame.f_lasti
    raw = code.co_code
    try:
        nones = all(
            raw[i + 2 * k] == _LOAD_CONST and code.co_consts[raw[i + 2 * k + 1]] is None
            for k in range(3)
        )
        return nones and raw[i + 6] in _CALLS
    except IndexError:
        return False


# Where locks, flocks, threads and Ctrl-C deferral are taken and let go: every line of
# them is interrupted; of the rest (reading the segment) a sample.
CRITICAL_FILES = tuple(
    os.path.join(*p)
    for p in [
        ("store", "lock.py"),
        ("store", "liveness.py"),
        ("zreplay", "threads.py"),
        ("engine", "writer.py"),
        ("engine", "replace.py"),
        ("engine", "committer.py"),
        ("engine", "preload.py"),
        ("core", "buffer.py"),
        ("api", "trajectory_buffer.py"),
    ]
)
CRITICAL_FUNCTIONS = {"guard", "_flock_within", "hold", "probe"}


class Interrupter:
    """A Ctrl-C at the ``at``-th line zreplay runs in this thread (None: count them): the
    SIGINT handler in force then is called there, as a signal's would be (the default one
    raises KeyboardInterrupt; one that holds Ctrl-C back records it)."""

    def __init__(self, at: int | None = None):
        self.at, self.lines, self.fired = at, 0, None
        self.critical: list[int] = []  # lines that take, hold or let go of a lock
        self._dir = os.path.dirname(zreplay.__file__)

    def _line(self, frame, event, arg):
        if event == "line" and not _at_with_exit(frame):
            self.lines += 1
            code = frame.f_code
            if code.co_name in CRITICAL_FUNCTIONS or code.co_filename.endswith(CRITICAL_FILES):
                self.critical.append(self.lines)
            if self.lines == self.at:
                sys.settrace(None)
                self.fired = f"{frame.f_code.co_filename}:{frame.f_lineno}"
                handler = signal.getsignal(signal.SIGINT)
                if callable(handler):
                    handler(signal.SIGINT, frame)
                return None
        return self._line

    def _call(self, frame, event, arg):
        return self._line if frame.f_code.co_filename.startswith(self._dir) else None

    def __enter__(self):
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)


OPENER = textwrap.dedent(
    """
    import sys, zreplay
    for line in sys.stdin:
        try:
            zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=line.strip()).close()
            print("opened", flush=True)
        except Exception as e:
            print(f"{type(e).__name__}: {e}".replace("\\n", " "), flush=True)
    """
)


def _within(fn, seconds: float) -> str | None:
    """None if ``fn()`` returned within ``seconds``; else what happened."""
    out: dict = {}

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported
            out["error"] = f"{type(e).__name__}: {e}"

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return "hangs" if t.is_alive() else out.get("error")


def _open(path):
    return zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path)


def _sweep(tmp_path, what: str, run, kept: set[int]) -> None:
    template = str(tmp_path / "template")
    with _open(template) as buf:
        buf.add_trajectories([_traj(0), _traj(1)])
    shutil.copytree(template, str(tmp_path / "count"))
    buf = _open(str(tmp_path / "count")) if what == "clear" else None
    with Interrupter() as count:
        buf = run(buf, str(tmp_path / "count"))
    buf.close()
    opener = subprocess.Popen(
        [sys.executable, "-c", OPENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        points = set(count.critical) | set(injection_points(count.lines, budget(40), seed=33))
        for at in sorted(points):
            path = str(tmp_path / f"b{at}")
            shutil.copytree(template, path)
            buf = _open(path) if what == "clear" else None
            interrupt = Interrupter(at)
            try:
                with interrupt:
                    buf = run(buf, path)
            except KeyboardInterrupt:
                pass
            where = f"Ctrl-C at line {at} of {count.lines} of {what} ({interrupt.fired})"
            if buf is not None:
                got = _within(buf.close, 20)
                assert got is None, f"{where}: close(): {got}"
            got = _within(lambda p=path: _open(p).close(), 20)
            assert got is None, f"{where}: a new writer in this process: {got}"
            opener.stdin.write(path + "\n")
            opener.stdin.flush()
            got = opener.stdout.readline().strip()
            assert got == "opened", f"{where}: a new writer in another process: {got}"
            assert zreplay.open(path).num_trajectories in kept, where
            shutil.rmtree(path)
    finally:
        opener.stdin.close()
        opener.wait(60)


@pytest.mark.slow  # about 100 s: a Ctrl-C at each of hundreds of lines
def test_a_ctrl_c_at_any_line_of_an_open_leaves_nothing_held(tmp_path):
    _sweep(tmp_path, "open", lambda buf, path: _open(path), {2})


@pytest.mark.slow  # about 100 s
def test_a_ctrl_c_at_any_line_of_a_clear_leaves_nothing_held(tmp_path):
    def clear(buf, path):
        buf.clear()
        return buf

    _sweep(tmp_path, "clear", clear, {0, 2})
