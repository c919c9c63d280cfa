"""Telling a live process from a dead one, across PID namespaces.

A pid says nothing outside its PID namespace: two containers on one host (Kubernetes
``hostNetwork`` pods, ``docker --network host``) share the host name but each sees the
other's pids as absent, or as its own.  So a file's owner is judged alive or dead only
on evidence that holds across namespaces:

* an ``flock`` the owner keeps on the file for as long as it lives (:func:`hold`): the
  kernel drops it when the process dies, however it dies, and every process on the same
  kernel sees it (:func:`probe`), whatever its PID namespace.  Trusted only where the
  prober runs on the owner's kernel (same :data:`BOOT_ID`); some network filesystems
  ignore or fake ``flock`` across machines;
* a pid, only within one PID namespace of one kernel (same :data:`BOOT_ID` and
  :data:`PID_NS`).

What cannot be judged here (another kernel, an object store) is left to the caller: the
writer lock waits for a lease to run out (:mod:`zreplay.store.lock`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator

from ..errors import CorruptBufferError
from ..forks import at_fork
from ..threads import deferred_interrupts

__all__ = [
    "BOOT_ID",
    "PID_NS",
    "Hold",
    "hold",
    "pid_alive",
    "probe",
    "process_tag",
    "same_pid_space",
    "open_tracked",
    "tag_is_dead",
    "tracked",
    "close_tracked",
]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _pid_ns() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


#: This kernel's boot id (the same in every container of one machine); None off Linux.
BOOT_ID: str | None = _read("/proc/sys/kernel/random/boot_id")
#: This process's PID namespace (e.g. ``pid:[4026531836]``); None off Linux.
PID_NS: str | None = _pid_ns()

# fds of flocks this process holds or is taking (holds, guards, probes): closed in a
# forked child, which must neither keep its parent's files looking alive after the parent
# died nor hold a guard its parent was inside when it forked.  A Hold the child inherited
# forgets its fd (the number may soon name another file of the child's).
_TRACKED: set[int] = set()
_HOLDS: weakref.WeakSet = weakref.WeakSet()
# Held while an fd is opened and tracked, and by a fork: no child is forked between the
# two (its untracked copy of the fd would keep a flock taken next alive).
_OPENING = threading.RLock()


def _close_in_child() -> None:
    global _OPENING
    _OPENING = threading.RLock()  # the parent's was held across the fork
    for fd in list(_TRACKED):
        try:
            os.close(fd)  # the child's copy only: the parent's flock stays
        except OSError:
            pass
    _TRACKED.clear()
    for h in list(_HOLDS):
        h.fd = None


def _before_fork() -> None:
    _OPENING.acquire()


def _after_fork_in_parent() -> None:
    _OPENING.release()


at_fork(_close_in_child, before=_before_fork, parent=_after_fork_in_parent)


def open_tracked(path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` of an fd that a fork closes in the child (see :func:`tracked`).  A
    lock file is never reached through a symbolic link (a buffer may come from a
    stranger: ``O_CREAT`` through one would make a file wherever it points):
    CorruptBufferError."""
    with _OPENING:
        try:
            fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise CorruptBufferError(
                f"{path} is a symbolic link where zreplay keeps a lock file; zreplay never "
                "opens a lock through a link (it could create a file outside the buffer). "
                "Remove the link"
            ) from None
        _TRACKED.add(fd)
    return fd


@contextlib.contextmanager
def tracked(fd: int) -> Iterator[int]:
    """Within the block, a fork closes the child's copy of ``fd`` (from
    :func:`open_tracked`: a flock taken on it stays the parent's alone); closed at the
    end, Ctrl-C held back meanwhile (one landing before the close would leak the fd,
    and a flock taken on it)."""
    with deferred_interrupts():
        _TRACKED.add(fd)
        try:
            yield fd
        finally:
            close_tracked(fd)


def close_tracked(fd: int) -> None:
    """Close an fd of :func:`open_tracked` (releasing a flock taken on it); no fork
    lands between the close and the untracking (its child would keep an untracked copy,
    and with it the flock)."""
    with _OPENING:
        try:
            os.close(fd)
        except OSError:
            pass
        _TRACKED.discard(fd)


def process_tag() -> str:
    """``<host>-<kernel><space>-<pid>``: what names a file this process is making, so
    that another process can tell whose it is (``kernel``, ``space``: 8 hex digits each
    naming this machine's kernel (boot id) and PID namespace; :func:`tag_is_dead` reads
    them back)."""
    host = socket.gethostname().replace("-", "_")
    return f"{host}-{_hash8(BOOT_ID)}{_hash8(PID_NS)}-{os.getpid()}"


def _hash8(value: str | None) -> str:
    if value is None:
        return "x" * 8  # no Linux ids: never comparable
    return hashlib.sha1(value.encode()).hexdigest()[:8]


def tag_is_dead(tag: str, path=None, made_then_held: bool = False) -> bool:
    """Whether the process a :func:`process_tag` names is gone, judged only on evidence
    that holds here: in this PID namespace its pid (and the ``flock`` it keeps on
    ``path``, if held); in another, only that ``flock`` being free (where the filesystem
    tells), and, if ``path`` is ``made_then_held`` (made first, its flock taken after),
    only once it is older than :data:`MAKING_GRACE_S`.  False when unsure (its file is
    left alone).  Tags of zreplay before PID namespaces were told (``<host>-<pid>``) are
    judged by pid, on this host, as then."""
    parts = tag.rsplit("-", 2)
    if len(parts) == 3 and parts[2].isdigit() and len(parts[1]) == 16:
        host, kernel, space, pid = parts[0], parts[1][:8], parts[1][8:], int(parts[2])
    else:
        head = tag.rsplit("-", 1)
        if len(head) != 2 or not head[1].isdigit():
            return False
        host, kernel, space, pid = head[0], None, None, int(head[1])
        if host != socket.gethostname().replace("-", "_"):
            return False  # a tag of zreplay before PID namespaces: by pid, on its host
        return not pid_alive(pid)
    if "x" in kernel or kernel != _hash8(BOOT_ID):
        return False  # another machine: neither its flock nor its pid can be seen here
    held = probe(path) if path is not None else None
    if held:
        return False
    if space == _hash8(PID_NS) and "x" not in space:  # its pid means what it says here
        return not pid_alive(pid)
    # Another PID namespace (or host name) on this kernel: its flock alone tells (a path
    # made before its flock was taken: once older than the moment between the two).
    return held is False and not (made_then_held and _just_made(path))


# A file or tree this young, unheld, may be its maker's between its mkdir (or create) and
# its flock: a free flock says nothing of its maker yet.  Generous: a leftover of a
# process that died is only removed by a later look.  (A tree renamed aside, localswap's
# ``old``, was held before it moved: no such moment, and no grace.)
MAKING_GRACE_S = 60.0


def _just_made(path) -> bool:
    try:
        return time.time() - os.lstat(path).st_mtime < MAKING_GRACE_S
    except OSError:
        return False  # gone: nothing to keep


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists in *this* PID namespace."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def same_pid_space(boot_id: str | None, pid_ns: str | None) -> bool:
    """Whether pids recorded with ``(boot_id, pid_ns)`` are this process's pids."""
    return boot_id is not None and boot_id == BOOT_ID and pid_ns is not None and pid_ns == PID_NS


class Hold:
    """An exclusive ``flock`` on a file or directory, held until :meth:`release` (or the
    process's death)."""

    def __init__(self, fd: int):
        self.fd: int | None = fd
        _TRACKED.add(fd)
        _HOLDS.add(self)

    def __del__(self):
        # Dropped without release() (its owner was collected): the fd must not leak,
        # or this process would keep the file looking alive for good.  A released one
        # (nearly all) enters no deferral: a Ctrl-C held back there would be raised
        # inside this finalizer, where Python ignores it (the user's Ctrl-C lost).
        if getattr(self, "fd", None) is not None:
            self.release()

    def release(self) -> None:
        with deferred_interrupts():  # a Ctrl-C between the two steps would leak the flock
            fd, self.fd = getattr(self, "fd", None), None
            if fd is None:
                return  # released, or inherited by a forked child (which closed its copy)
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)  # for every fd sharing it, forked ones too
            except OSError:
                pass
            close_tracked(fd)


# How long :func:`hold` waits out a flock held by someone else: a :func:`probe` holds one
# for a few microseconds.  A file or directory just made (a lock file, a staged tree, a
# partial dump) has no other holder; a tree being replaced (localswap's fallback without
# RENAME_EXCHANGE) may have, for as long as another replacement removes what it swapped
# out: waited for up to this long, then held without a flock, as before.
HOLD_WAIT_S = 0.5
# What a non-blocking flock fails with where someone else holds it (any other errno: this
# filesystem cannot tell).
_HELD_ELSEWHERE = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def hold(path) -> Hold | None:
    """Take an exclusive ``flock`` on ``path`` (file or directory) and keep it; None
    where the filesystem has no ``flock`` or someone else holds it for longer than
    :data:`HOLD_WAIT_S`.  A prober's flock is waited out: given up on at once, the file
    would stay unheld, and the next prober would judge its owner dead."""
    # Ctrl-C held back until the flock is in a Hold (which releases it when dropped):
    # one landing in between would keep the file looking alive for good.
    with deferred_interrupts():
        try:
            fd = open_tracked(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            took = _flock_soon(fd)
        except BaseException:  # (a signal handler's exception during the wait)
            close_tracked(fd)
            raise
        if not took:
            close_tracked(fd)
            return None
        return Hold(fd)


def _flock_soon(fd: int) -> bool:
    """Take an exclusive flock on ``fd``, retried while someone else holds it, for at
    most :data:`HOLD_WAIT_S`; False if it could not (held all along, or no flock here)."""
    deadline, pause = time.monotonic() + HOLD_WAIT_S, 0.0002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno not in _HELD_ELSEWHERE or time.monotonic() >= deadline:
                return False
        time.sleep(pause)  # (outside the except: what a handler raises here goes up)
        pause = min(pause * 2, 0.02)


def probe(path) -> bool | None:
    """Whether a live process holds an ``flock`` on ``path``: True, False (nobody does,
    or ``path`` is gone), or None where this filesystem cannot tell."""
    with deferred_interrupts():  # the probe's own flock must never outlive it
        return _probe(path)


def _probe(path) -> bool | None:
    try:
        fd = open_tracked(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    with tracked(fd):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            return True if e.errno in _HELD_ELSEWHERE else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
