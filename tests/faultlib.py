"""Fault injection at the store layer's I/O calls, the way SQLite tests its I/O paths.

:class:`Faults` wraps every store-layer method that touches storage (:func:`points`):
the local backend's file operations and ``LocalPath``'s, the S3 backend's seven
requests, array opens/resizes, segment row and index reads and writes, saved priorities,
the root's attribute writes and tree swaps, and the plain-file writes of RLinf exports
and HDF5 dumps.  Installed unarmed it counts the calls an
operation makes (in every thread: the background committer's too); armed with ``at=i``
the ``i``-th call raises ``OSError(EIO)`` (``mode="error"``) or ends the process on the
spot with ``os._exit(CRASH_STATUS)`` (``mode="crash"``, run in a child process), the
moment a power cut or a ``kill -9`` would.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import os
import random
import shutil
import threading
from collections.abc import Iterator

from zreplay.errors import ZReplayError

CRASH_STATUS = 87
# Threads whose name starts with one of these are bystanders: readers racing the operation
# under test (tests/test_state_machine.py) and the writer lock's lease renewer, which runs
# on its own clock (every lease/6 s; a failed renewal is retried): their calls are not
# counted (so a sweep's calls do not depend on timing) and never fail.
BYSTANDERS = ("bystander", "zreplay-lease")
# Threads already running when the faults are installed are bystanders too (a preload, a
# prefetch or a dropped buffer's close left by an earlier test, still reading under CI's
# load, would otherwise take the fault meant for the operation), except the installing
# thread and the shared I/O pools' workers, which serve the operation under test.
POOLS = ("zreplay-io", "zreplay-s3io", "zreplay-s3")


def points() -> list[tuple[object, list[str]]]:
    """``(owner, method names)`` of every store-layer call that does I/O."""
    from zreplay.compat import hdf5, rlinf_files
    from zreplay.store import arrays, backend_local, backend_s3, localswap, priority, root, segment

    return [
        (
            backend_local.LocalBackend,
            ["publish", "create_exclusive", "remove_tree", "move_tree", "remove_file"]
            + ["read_data"]
            + ["remove_dead_temps", "check_files"]
            + ["import_file", "import_tree", "remove_temps"],
        ),
        (
            backend_local.LocalPath,
            ["read_bytes", "read_text", "write_bytes", "write_text", "unlink", "mkdir"]
            + ["rename", "replace", "iterdir"],
        ),
        (backend_s3.S3Backend, ["get", "put", "create", "delete", "list", "head", "copy"]),
        (arrays.ArrayHandle, ["_open", "start_resize", "finish_resize"]),
        (
            segment.Segment,
            ["create_arrays", "write_rows", "write_index", "read_index", "read_points"]
            + ["read_range"],
        ),
        (priority.PriorityArrays, ["write", "read"]),
        (root.BufferRoot, ["_set_attr"]),
        (localswap, ["swap_in"]),
        # Plain-file writes of exports and HDF5 dumps (each file written and fsync'd,
        # each column's rows, the finished file put in place).
        (rlinf_files, ["_write_synced"]),
        (hdf5._Column, ["append", "close"]),
        (hdf5, ["_put_in_place"]),
    ]


class Faults:
    """Counts store-layer I/O calls and fails the ``at``-th (see the module docstring)."""

    def __init__(self, at: int | None = None, mode: str = "error"):
        assert mode in ("error", "crash")
        self.at, self.mode = at, mode
        self.calls = 0
        self.names: list[str] = []
        self.fired: str | None = None
        self._lock = threading.Lock()
        self._before: set[threading.Thread] = set()

    def _bystander(self, thread: threading.Thread) -> bool:
        if thread.name.startswith(BYSTANDERS):
            return True
        return thread in self._before and not thread.name.startswith(POOLS)

    def hit(self, name: str) -> None:
        thread = threading.current_thread()
        if self._bystander(thread):
            return  # not the operation under test: neither counted nor failed
        with self._lock:
            self.calls += 1
            n = self.calls
            if self.at is None:
                self.names.append(name)
        if n != self.at:
            return
        self.fired = f"{name} in thread {thread.name}"
        if self.mode == "crash":
            os._exit(CRASH_STATUS)
        raise OSError(errno.EIO, f"injected I/O error at store call {n} ({name})")

    def _wrap(self, fn, label: str):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self.hit(label)
            return fn(*args, **kwargs)

        return wrapper

    @contextlib.contextmanager
    def installed(self) -> Iterator[Faults]:
        saved = []
        self._before = set(threading.enumerate()) - {threading.current_thread()}
        try:
            for owner, names in points():
                for name in names:
                    raw = inspect.getattr_static(owner, name)
                    own = name in vars(owner)
                    fn = raw.__func__ if isinstance(raw, staticmethod) else raw
                    label = f"{getattr(owner, '__name__', owner).rsplit('.', 1)[-1]}.{name}"
                    wrapped = self._wrap(fn, label)
                    setattr(
                        owner,
                        name,
                        staticmethod(wrapped) if isinstance(raw, staticmethod) else wrapped,
                    )
                    saved.append((owner, name, raw, own))
            yield self
        finally:
            for owner, name, raw, own in reversed(saved):
                if own:
                    setattr(owner, name, raw)
                else:
                    delattr(owner, name)


def injection_points(n_calls: int, budget: int, seed: int) -> list[int]:
    """Every call index ``1..n_calls``, or a seeded sample of ``budget`` of them (always
    with the first and the last)."""
    every = list(range(1, n_calls + 1))
    if n_calls <= budget:
        return every
    rng = random.Random(seed)
    middle = rng.sample(every[1:-1], budget - 2)
    return sorted({1, n_calls, *middle})


def budget(default: int) -> int:
    """Points per scenario and mode: ``ZREPLAY_FAULT_POINTS`` (``all`` for every call),
    else ``default`` (the CI-sized sweep)."""
    raw = os.environ.get("ZREPLAY_FAULT_POINTS", "")
    if raw == "all":
        return 1 << 30
    return int(raw) if raw else default


class Interrupts(Faults):
    """Faults whose armed call raises KeyboardInterrupt (a Ctrl-C at that line)."""

    def hit(self, name: str) -> None:
        try:
            super().hit(name)
        except OSError:
            raise KeyboardInterrupt from None


def sweep_faults(template, workdir, points, faults_of, run, outcome, seen: dict) -> None:
    """For each store call ``at`` in ``points``: ``run(path)`` on a fresh copy of
    ``template`` under ``workdir`` with ``faults_of(at)`` installed (an error, or a
    Ctrl-C where the faults are :class:`Interrupts`), then ``seen[outcome(path)] += 1``
    (``outcome`` judges what the operation left and raises if it is neither state)."""
    for at in points:
        path = workdir / f"at{at}"
        shutil.copytree(template, path)
        faults = faults_of(at)
        try:
            with faults.installed():
                run(path)
        except (OSError, ZReplayError) as e:
            assert str(e), "an error without a message"
        except KeyboardInterrupt:
            assert isinstance(faults, Interrupts), "a Ctrl-C nobody sent"
        assert faults.fired
        try:
            seen[outcome(path)] += 1
        except BaseException as err:
            err.add_note(f"after a fault at store call {at}: {faults.fired}")
            raise
        shutil.rmtree(path)


def sweep_kills(template, workdir, points, ctx, target, outcome, seen: dict) -> None:
    """For each store call ``at`` in ``points``: ``target(path, at)`` in a child process
    (``ctx``) on a fresh copy of ``template``, killed at that call (``Faults(at,
    "crash")`` there), then ``seen[outcome(path)] += 1``."""
    for at in points:
        path = workdir / f"at{at}"
        shutil.copytree(template, path)
        child = ctx.Process(target=target, args=(str(path), at))
        child.start()
        child.join(120)
        assert child.exitcode in (0, CRASH_STATUS), f"exit code {child.exitcode} at call {at}"
        try:
            seen[outcome(path)] += 1
        except BaseException as err:
            err.add_note(f"after a crash at store call {at}")
            raise
        shutil.rmtree(path)
