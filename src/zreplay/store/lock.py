"""The writer lock of a segment: one writer per segment, failing fast for a second one,
and taken over only when its holder is provably gone.

The lock is a file, ``writer.lock``, holding ``{host, pid, token, time, boot, pidns,
lease_s}``, created exclusively and never seen empty (written aside and hard-linked into
place; a conditional PUT in an object store).  Whether its holder is alive is judged only
on evidence that holds across hosts and PID namespaces (containers on one host share its
name but not its pids; :mod:`zreplay.store.liveness`):

1. on the holder's kernel (same boot id), the ``flock`` the holder keeps on the lock file
   while it lives: held means alive, free means dead, whatever the PID namespace;
2. in the holder's own PID namespace of that kernel, its pid;
3. anywhere else (another machine, an object store): the lease.  The holder renews
   ``writer.lock.beat`` (``{token, seq}``) every ``lease_s / 6`` seconds; a contender
   watches it and takes the lock over only once it saw no renewal for ``lease_s`` of its
   own clock (no clocks are compared across machines).  A live holder is found out
   within one renewal, so a second writer still fails in seconds.

A holder checks before publishing each commit that the lock file still names its token
(:meth:`WriterLock.check_held`); a writer whose lock was taken over (stopped or cut off
for longer than its lease) fails instead of overwriting the new writer's commits.  Locks
written by zreplay before leases (no ``boot`` field) are judged as then: by pid on the
same host, never automatically from another host.  ``break_lock=True`` takes any lock.

``ZREPLAY_LOCK_LEASE_S`` sets the lease (default 30 s, within [0.5, 3600]) of the locks a
process takes.  Locally, a commit is written under the lock's guard (:meth:`WriterLock.fenced`),
so a takeover, ``break_lock=True`` included, never lands in the middle of one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Iterator

from ..errors import CorruptBufferError, WriterLockedError
from ..forks import at_fork, on_fork
from ..threads import InterruptSafeCondition, deferred_interrupts
from .format import lock_path
from .liveness import BOOT_ID, PID_NS, pid_alive, same_pid_space
from .location import Location, locate

log = logging.getLogger("zreplay")

DEFAULT_LEASE_S = 30.0
# A lease shorter than a few renewals of a loaded machine invites takeovers of live
# writers; one longer than an hour makes a dead writer's segment wait that long.
MIN_LEASE_S, MAX_LEASE_S = 0.5, 3600.0
LIVE, STALE, UNKNOWN = "live", "stale", "unknown"
# The key holder() marks an unreadable lock file's stand-in with.
DAMAGED = "damaged"

# Tokens of the locks lock objects of this process hold.
_HELD_HERE: set[str] = set()
# Tokens of held locks whose buffer was dropped and is being closed on another thread:
# acquire() in this process waits for their release instead of failing.
_RELEASING: dict[str, threading.Event] = {}
RELEASE_WAIT_S = 120.0


def _forget_held() -> None:
    # A forked child holds none of its parent's locks (it judges them as any process
    # does: by their flock, which liveness closed in the child), and no thread of the
    # child will ever signal the releases the parent's threads were making.
    _HELD_HERE.clear()
    _RELEASING.clear()


at_fork(_forget_held)


def lease_seconds() -> float:
    """The lease of locks taken by this process: ``ZREPLAY_LOCK_LEASE_S`` (seconds, within
    [0.5, 3600]), default 30.  A value outside is refused (``ValueError``) when a lock is
    taken, rather than silently making locks unsafe or takeovers endless."""
    raw = os.environ.get("ZREPLAY_LOCK_LEASE_S")
    if raw is None:
        return DEFAULT_LEASE_S
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not MIN_LEASE_S <= v <= MAX_LEASE_S:  # NaN and inf fail too
        raise ValueError(
            f"ZREPLAY_LOCK_LEASE_S={raw!r}: the writer lock's lease must be a number of "
            f"seconds in [{MIN_LEASE_S:g}, {MAX_LEASE_S:g}] (default {DEFAULT_LEASE_S:g})"
        )
    return v


class WriterLock:
    """An exclusive lock file in a segment directory (see the module docstring)."""

    def __init__(self, segment_dir: Location):
        segment_dir = locate(segment_dir)
        self.path = lock_path(segment_dir)
        self.beat_path = self.path.with_name(self.path.name + ".beat")
        self.token = uuid.uuid4().hex
        self.held = False
        self.lease_s = lease_seconds()
        self.lost: str | None = None  # why this lock is no longer ours, once it is not
        self._flock = None
        self._seq = 0
        self._beat_due = 0.0
        self._mutex = threading.Lock()
        self._renewed = -float("inf")  # monotonic time of the last renewal published
        on_fork(self, WriterLock._forked)

    def _forked(self) -> None:
        # A forked child's copy: the lock, its flock and its lease stay the parent's, so
        # this copy never releases, renews or commits under them (release and renew find
        # nothing held; check_held fails).  The child's copy of the flock's fd is closed
        # by liveness; another parent thread may have held the mutex at the fork.
        self.held, self._flock, self._mutex = False, None, threading.Lock()

    # -- who holds it ---------------------------------------------------------------

    def holder(self, path: Location | None = None) -> dict | None:
        try:
            info = json.loads((path or self.path).read_text())
            if not isinstance(info, dict) or not isinstance(info.get("token"), str):
                raise ValueError("not a lock's fields")  # (crafted: judged as damaged)
            return info
        except (FileNotFoundError, NotADirectoryError):  # (no lock file can be there)
            return None
        except IsADirectoryError:
            raise _not_a_lock_file(path or self.path) from None
        except ValueError:
            # Unreadable (an older zreplay could leave it empty, or it was damaged in
            # place): no holder to name, but its holder may live and keep its flock.
            return {"host": socket.gethostname(), "pid": -1, "token": "", "time": 0, DAMAGED: True}

    def judge(self, info: dict, path: Location | None = None) -> str:
        """``LIVE``, ``STALE`` or ``UNKNOWN`` (only a lease can tell) for the holder
        ``info`` of the lock file at ``path`` (default this lock's)."""
        token, pid = info.get("token"), _as_pid(info.get("pid", -1))
        if token and token in _HELD_HERE:
            return LIVE
        path = path or self.path
        if info.get(DAMAGED) or "boot" not in info:
            # No boot id to trust a flock by, but a flock held on this kernel is a live
            # holder whatever the file says (its holder may write a lock file older
            # zreplay wrote, or one damaged in place under it): the flock is the truth.
            held = path.backend.probe(path)
            if held:
                return LIVE
            if info.get(DAMAGED):
                # Free flock: its holder is gone (or was never on this kernel); where
                # no flock can tell, only the lease can.
                return STALE if held is False else UNKNOWN
        if "boot" not in info:  # a lock of a zreplay before leases: judged as it was
            if info.get("host") != socket.gethostname():
                return LIVE
            return STALE if pid <= 0 or pid == os.getpid() or not pid_alive(pid) else LIVE
        if BOOT_ID is not None and info.get("boot") == BOOT_ID:
            held = path.backend.probe(path)
            if held is not None:
                return LIVE if held else STALE
            if same_pid_space(info.get("boot"), info.get("pidns")):
                return STALE if pid == os.getpid() or not pid_alive(pid) else LIVE
        return UNKNOWN

    def live_holder(self, path: Location | None = None) -> dict | None:
        """The holder of this lock (or of the lock file at ``path``: where format 2 kept
        it, for store/upgrade.py) if it may still be writing, or None.  Judged without
        waiting: a holder only a lease could judge counts as live."""
        path = path or self.path
        info = self.holder(path)
        if info is not None and self.judge(info, path) != STALE:
            return info
        return None

    def clear_if_gone(self, break_lock: bool = False) -> dict | None:
        """The holder of this lock if it is alive, or None; a lock whose holder was found
        gone is removed, as a takeover removes it, so that the next one to look does not
        watch its lease again.  Judged as :meth:`acquire` judges, under the lock's guard
        (which its taker holds from making the file to taking its flock), a lease
        watched outside it; with ``break_lock`` only what this machine sees alive counts
        (:meth:`seen_alive`), no lease is watched, and the legacy verdict on a lock
        without a boot id (another host: live) is overruled."""
        if self.holder() is None:  # (the common case: no guard file made)
            return None
        for _ in range(8):
            with self._contender_guard():
                info = self.holder()
                if info is None:
                    return None
                verdict = self.judge(info)
                if break_lock:
                    verdict = LIVE if self.seen_alive(info) else STALE
                if verdict == LIVE:
                    return info
                if verdict == STALE:
                    self._remove(info)
                    return None
            watched = self._read_beat()
            verdict = self._watch_lease(info, watched)
            if verdict == LIVE:
                return info
            if verdict == UNKNOWN:
                continue  # released or taken meanwhile: judge the lock as it is now
            with self._contender_guard():
                if self._unrenewed(info, watched):
                    self._remove(info)  # (only if still that holder's: see _remove)
            return None
        return self.live_holder()  # changing hands all along: whoever holds it now

    def seen_alive(self, info: dict) -> bool:
        """Does this machine see the holder ``info`` of this lock alive: this process,
        its ``flock`` held (where a store has flocks, they are the truth), or else a live
        pid of this boot and PID namespace?"""
        if info.get("token") in _HELD_HERE:
            return True
        held = self.path.backend.probe(self.path)
        if held is not None:
            return held
        pid = _as_pid(info.get("pid", -1))
        return (
            BOOT_ID is not None
            and info.get("boot") == BOOT_ID
            and same_pid_space(info.get("boot"), info.get("pidns"))
            and 0 < pid != os.getpid()
            and pid_alive(pid)
        )

    # -- taking it ------------------------------------------------------------------

    def acquire(self, break_lock: bool = False) -> None:
        try:
            self._acquire(break_lock)
        except BaseException:
            if self.held:  # made, then failed (its first lease beat, a takeover's check):
                self.release()  # nothing stays held by an object nobody has
            raise

    def _acquire(self, break_lock: bool) -> None:
        took_over = False
        for _ in range(8):
            with self._contender_guard():
                if self._create():
                    if not took_over or self._kept_after_takeover():
                        return
                    took_over = False  # another contender won the same takeover
                    continue
                info = self.holder()
                if info is None:
                    continue  # released meanwhile
                verdict = STALE if break_lock else self.judge(info)
                if verdict == STALE:
                    took_over = self._remove(info) or took_over
                    continue
                released = _RELEASING.get(info.get("token"))
                if verdict == LIVE and released is None:
                    raise self._locked(info)
            if released is not None:  # a dropped buffer of this process is letting go
                released.wait(RELEASE_WAIT_S)
                continue
            # Only the lease can tell: watch it (outside the guard), then take over.
            watched = self._read_beat()
            verdict = self._watch_lease(info, watched)
            if verdict == LIVE:
                raise self._locked(info)
            if verdict == UNKNOWN:
                continue  # released or taken meanwhile: judge the lock as it is now
            with self._contender_guard():
                now = self.holder()
                same = now is not None and now.get("token") == info.get("token")
                if same and self._unrenewed(info, watched):
                    log.warning(
                        "zreplay: taking over %s: its holder (pid %s on host %r) did not "
                        "renew its lease for %.0f s",
                        self.path,
                        info.get("pid"),
                        info.get("host"),
                        _lease_of(info),
                    )
                    took_over = self._remove(info) or took_over
        raise WriterLockedError(f"could not take the writer lock {self.path}; retry")

    def _create(self) -> bool:
        """Create the lock file (never seen empty) and hold its ``flock``; False if a
        lock file is there."""
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "token": self.token,
            "time": time.time(),
            "boot": BOOT_ID,
            "pidns": PID_NS,
            "lease_s": self.lease_s,
        }
        backend = self.path.backend
        # Ctrl-C held back from creating the file to marking it held: one landing in
        # between would leave a lock (and its flock) that nothing releases.
        with deferred_interrupts():
            if not backend.create_exclusive(self.path, json.dumps(me).encode()):
                return False
            self._flock = backend.hold(self.path)  # inside the guard: no prober sees it free
            self.held, self.lost = True, None
            _HELD_HERE.add(self.token)
        self._beat()
        self._beat_due = time.monotonic() + self.lease_s / 6
        _RENEWER.add(self)
        return True

    @contextlib.contextmanager
    def _contender_guard(self) -> Iterator[None]:
        """The lock's guard, for judging and taking it: waited for at most a lease (a
        holder inside a commit keeps it: see :meth:`fenced`)."""
        try:
            with self.path.backend.guard(self.path, timeout=self.lease_s):
                yield
        except TimeoutError:
            info = self.holder() or {}
            raise WriterLockedError(
                f"segment {self.path.parent.parent}: its writer (pid {info.get('pid')} on "
                f"host {info.get('host')!r}) has been in the middle of a commit for more than "
                f"{self.lease_s:g} s, so it is alive (stopped, or stuck in I/O?); it cannot be "
                "taken over in the middle of a commit, break_lock=True included. Retry once "
                "that process ended or went on"
            ) from None

    def _remove(self, info: dict) -> bool:
        """Remove the lock file of ``info``'s holder (judged gone) and its beat, if the
        lock file is still that holder's (where the store has no guard, another
        contender may have taken it meanwhile); returns whether it removed it."""
        now = self.holder()
        if now is None or now.get("token") != info.get("token"):
            return False
        beat = self._read_beat()  # (before anything is removed: it may be damage)
        self.path.unlink(missing_ok=True)
        if beat is None or beat[0] == info.get("token"):
            self.beat_path.unlink(missing_ok=True)
        return True

    def _kept_after_takeover(self) -> bool:
        """After taking a dead holder's lock over where the store has no guard (object
        stores): two contenders that judged the same lock stale may both have removed
        it, the slower one removing the faster one's new lock.  Wait a moment, then
        check the lock is still ours; if not, let it go (the caller judges it again)."""
        if self.path.backend.is_local:
            return True  # judged, removed and created under the guard: one winner
        time.sleep(min(1.0, self.lease_s / 10))
        info = self.holder()
        if info is not None and info.get("token") == self.token:
            return True
        self._forget()
        return False

    def _forget(self) -> None:
        """This process's state of a lock it turned out not to hold (no file touched)."""
        self.held = False
        _RENEWER.discard(self)
        _HELD_HERE.discard(self.token)
        if self._flock is not None:
            self._flock.release()
            self._flock = None

    def _read_beat(self) -> tuple[str, int] | None:
        try:
            d = json.loads(self.beat_path.read_bytes())
            return str(d["token"]), int(d["seq"])
        except (FileNotFoundError, NotADirectoryError, ValueError, KeyError, TypeError):
            return None
        except OverflowError:  # (JSON's Infinity is a float int() refuses)
            return None
        except IsADirectoryError:
            raise _not_a_lock_file(self.beat_path) from None

    def _unrenewed(self, info: dict, watched: tuple[str, int] | None) -> bool:
        """Has the holder of ``info`` not renewed its lease since its beat was
        ``watched`` (its beat the same, gone, or another holder's)?"""
        beat = self._read_beat()
        return beat is None or beat[0] != info.get("token") or beat == watched

    def _watch_lease(self, info: dict, first: tuple[str, int] | None) -> str:
        """Watch the holder of ``info`` (whose beat was ``first``) for its lease: ``LIVE``
        as soon as it renews, ``UNKNOWN`` if the lock is released or changes hands
        meanwhile (judge it afresh), ``STALE`` once it did not renew for the whole lease."""
        lease, token = _lease_of(info), info.get("token")
        start = time.monotonic()
        while time.monotonic() - start < lease:
            time.sleep(min(1.0, lease / 20))
            now = self.holder()
            if now is None or now.get("token") != token:
                return UNKNOWN
            beat = self._read_beat()
            if beat is not None and beat[0] == token and beat != first:
                return LIVE
        return STALE

    def _locked(self, info: dict) -> WriterLockedError:
        here = ""
        if info.get("token") in _HELD_HERE:
            here = (
                " That is this process: another buffer object still holds the segment "
                "(a notebook cell run twice?); close() it or `del` it first."
            )
        who = f"pid {info.get('pid')} on host {info.get('host')!r}"
        if info.get(DAMAGED):
            who = "a live process that holds its lock's flock (the lock file is damaged)"
        return WriterLockedError(
            f"segment {self.path.parent.parent} is being written by {who} (lock "
            f"{self.path}).{here} Use another writer_id, "
            "open it read-only with zreplay.open(), or, if that writer is gone, "
            "pass break_lock=True"
        )

    # -- holding it -----------------------------------------------------------------

    def renew(self) -> None:
        """Renew the lease (the renewer thread calls this); finds out a lost lock."""
        with self._mutex:  # never after release() removed the files
            if not self.held or self.lost:
                return
            info = self.holder()
            if info is None or info.get("token") != self.token:
                self._mark_lost(info)
                return
            try:
                self._beat()
            except FileNotFoundError:  # its temp file removed by a recovery: once more
                self._beat()

    def _beat(self) -> None:
        started = time.monotonic()  # no contender can see this beat before now
        self._seq += 1
        beat = {"token": self.token, "seq": self._seq, "time": time.time()}
        self.path.backend.publish(self.beat_path, json.dumps(beat).encode(), durable=False)
        self._renewed = started

    def _mark_lost(self, info: dict | None) -> None:
        if info is None:
            self.lost = f"its lock file {self.path} was removed (by hand, or by a process"
            self.lost += " that took its holder for gone)"
        else:
            self.lost = (
                f"pid {info.get('pid')} on host {info.get('host')!r} took its lock "
                f"{self.path} over (with break_lock=True, or once this writer's lease of "
                f"{self.lease_s:g} s ran out: was this process stopped or cut off that long?)"
            )
        log.error("zreplay: writer lock lost: %s", self.lost)

    def check_held(self) -> None:
        """Before a commit: ``WriterLockedError`` once this lock may no longer be ours.

        No contender takes a lock over before a whole lease passed without a renewal
        (on its clock), so a renewal less than half a lease ago (on ours) proves the lock
        is still held without reading anything: what object stores get, where each read
        is a request.  Locally, where a read costs microseconds, the lock file is read as
        well (it catches a ``break_lock=True`` at once); and after a renewal gap it is
        read and the lease renewed before going on."""
        if not self.held:
            raise WriterLockedError(f"{self.path}: this writer does not hold its lock")
        if self.lost is None:
            recent = time.monotonic() - self._renewed < self.lease_s / 2
            if self.path.backend.is_local or not recent:
                with self._mutex:
                    info = self.holder()
                    if info is None or info.get("token") != self.token:
                        self._mark_lost(info)
                    elif not recent:
                        self._beat()
        if self.lost is not None:
            raise WriterLockedError(
                f"this writer no longer holds segment {self.path.parent.parent}: {self.lost}. "
                "Nothing more is committed by this buffer object; what it committed before "
                "is safe. Reopen the buffer once the other writer is done"
            )

    @contextlib.contextmanager
    def fenced(self) -> Iterator[None]:
        """A block of writes that must be this lock's holder's alone (a commit's rows and
        its record): it starts only while the lock is still held (``check_held``), and
        where the store has a guard (local files: an ``flock``) it holds it throughout,
        so that no takeover, ``break_lock=True`` included, happens until it is done."""
        with self.path.backend.guard(self.path):
            self.check_held()
            yield

    def release(self) -> None:
        """Give the lock up.  If removing the file fails (an I/O error), the lock is
        still given up: its ``flock`` is released, so the next writer on this kernel
        finds it stale (and on another, once the lease ran out)."""
        try:
            self._release()
        finally:
            released = _RELEASING.pop(self.token, None)
            if released is not None:
                released.set()

    def releasing(self) -> None:
        """This lock's buffer was dropped and is being closed on another thread: until it
        is released, :meth:`acquire` in this process waits for it rather than failing."""
        if self.held:
            _RELEASING.setdefault(self.token, threading.Event())

    def _release(self) -> None:
        with deferred_interrupts():  # once it is marked released, it must be let go
            self._let_go()

    def _let_go(self) -> None:
        with self._mutex:
            if not self.held:
                return
            self.held = False
        _RENEWER.discard(self)
        _HELD_HERE.discard(self.token)
        try:
            if not self.path.exists():
                # Moved away with its tree (a replacement swapped the tree that held it
                # out) or removed: no guard file is made where another tree is now.
                beat = self._read_beat()
                if beat is not None and beat[0] == self.token:
                    self.beat_path.unlink(missing_ok=True)
                return
            with self.path.backend.guard(self.path):
                info = self.holder()
                if info is not None and info.get("token") == self.token:
                    self.path.unlink(missing_ok=True)
                    beat = self._read_beat()
                    if beat is None or beat[0] == self.token:
                        self.beat_path.unlink(missing_ok=True)
        finally:
            if self._flock is not None:
                self._flock.release()
                self._flock = None


def _as_pid(value) -> int:
    """The pid a lock file names; -1 (none) for anything but an integer."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # JSON's Infinity, NaN
        return -1


def _not_a_lock_file(path: Location) -> CorruptBufferError:
    return CorruptBufferError(
        f"{path} is a directory where zreplay keeps a lock file: the buffer was damaged "
        "or crafted. Remove it (no zreplay process makes it), then open the buffer again"
    )


def _lease_of(info: dict) -> float:
    """The holder's lease as its lock says, within the bounds a lease may have."""
    try:
        v = float(info.get("lease_s", DEFAULT_LEASE_S))
    except (TypeError, ValueError):
        return DEFAULT_LEASE_S
    return min(max(v, MIN_LEASE_S), MAX_LEASE_S) if v == v else DEFAULT_LEASE_S


class _Renewer:
    """One daemon thread renewing the leases of every lock this process holds, each
    every ``lease_s / 6``.  A failed renewal is logged and retried; it never stops the
    thread (a lock that cannot be renewed for a whole lease may be taken over, and its
    writer then fails at its next commit)."""

    def __init__(self):
        self._locks: weakref.WeakSet = weakref.WeakSet()
        self._cond = InterruptSafeCondition()
        self._thread: threading.Thread | None = None
        on_fork(self, _Renewer._forked)

    def _forked(self) -> None:
        # A forked child holds none of its parent's locks, the thread did not come along,
        # and it may have held the condition's lock at the fork.
        self._locks, self._thread = weakref.WeakSet(), None
        self._cond = InterruptSafeCondition()

    def add(self, lock: WriterLock) -> None:
        with self._cond:
            self._locks.add(lock)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="zreplay-lease", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def discard(self, lock: WriterLock) -> None:
        with self._cond:
            self._locks.discard(lock)

    def _run(self) -> None:
        while True:
            with self._cond:
                locks = list(self._locks)
                if not locks:
                    self._cond.wait(5.0)
                    continue
            now = time.monotonic()
            for lock in locks:
                if now < lock._beat_due:
                    continue
                lock._beat_due = now + lock.lease_s / 6
                try:
                    lock.renew()
                except Exception as e:  # noqa: BLE001 - logged; retried next round
                    log.warning("zreplay: could not renew the writer lock %s: %r", lock.path, e)
            due = min((lk._beat_due for lk in locks), default=now + 1.0)
            with self._cond:
                self._cond.wait(max(0.05, min(1.0, due - time.monotonic())))


_RENEWER = _Renewer()
