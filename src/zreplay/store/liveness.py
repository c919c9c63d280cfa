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

import errno
import fcntl
import hashlib
import os
import socket

__all__ = [
    "BOOT_ID",
    "PID_NS",
    "Hold",
    "hold",
    "pid_alive",
    "probe",
    "process_tag",
    "same_pid_space",
    "tag_is_dead",
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

# flock fds this process holds: closed in a forked child, so that a child never keeps its
# parent's files looking alive after the parent died (the parent's own fds hold them).
_HELD: set[int] = set()


def _close_in_child() -> None:
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


def process_tag() -> str:
    """``<host>-<space>-<pid>``: what names a file this process is making, so that
    another process can tell whose it is (``space``: 8 hex digits naming this kernel's
    PID namespace; :func:`tag_is_dead` reads it back)."""
    host = socket.gethostname().replace("-", "_")
    return f"{host}-{_space_of(BOOT_ID, PID_NS)}-{os.getpid()}"


def _space_of(boot_id: str | None, pid_ns: str | None) -> str:
    if boot_id is None or pid_ns is None:
        return "x" * 8  # no Linux ids: never comparable
    return hashlib.sha1(f"{boot_id}/{pid_ns}".encode()).hexdigest()[:8]


def tag_is_dead(tag: str, path=None) -> bool:
    """Whether the process a :func:`process_tag` names is gone, judged only on evidence
    that holds here: in this PID namespace its pid (and the ``flock`` it keeps on
    ``path``, if held); in another, only that ``flock`` being free (where the filesystem
    tells).  False when unsure (its file is left alone).  Tags of zreplay before PID
    namespaces were told (``<host>-<pid>``) are judged by pid, on this host, as then."""
    parts = tag.rsplit("-", 2)
    if len(parts) == 3 and parts[2].isdigit() and len(parts[1]) == 8:
        host, space, pid = parts[0], parts[1], int(parts[2])
    else:
        head = tag.rsplit("-", 1)
        if len(head) != 2 or not head[1].isdigit():
            return False
        host, space, pid = head[0], None, int(head[1])
    if host != socket.gethostname().replace("-", "_"):
        return False
    held = probe(path) if path is not None else None
    if held:
        return False
    ours = space is None or (space == _space_of(BOOT_ID, PID_NS) and "x" not in space)
    if ours:  # its pid means what it says: both must agree it is gone
        return not pid_alive(pid)
    return held is False  # another PID namespace: only its free flock can tell


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
        _HELD.add(fd)

    def __del__(self):
        # Dropped without release() (its owner was collected): the fd must not leak,
        # or this process would keep the file looking alive for good.
        self.release()

    def release(self) -> None:
        fd, self.fd = getattr(self, "fd", None), None
        if fd is None:
            return
        _HELD.discard(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)  # for every fd sharing it, forked ones too
        except OSError:
            pass
        try:
            os.close(fd)
        except OSError:
            pass


def hold(path) -> Hold | None:
    """Take an exclusive ``flock`` on ``path`` (file or directory) and keep it; None
    where the filesystem has no ``flock`` or someone else holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return Hold(fd)


def probe(path) -> bool | None:
    """Whether a live process holds an ``flock`` on ``path``: True, False (nobody does,
    or ``path`` is gone), or None where this filesystem cannot tell."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        return True if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
