"""The writer lock of a segment: one writer per segment, failing fast for a second one.

The lock is a file holding ``{host, pid, token, time}``, written aside and hard-linked into
place (exclusive, like O_EXCL, and never seen empty).  A lock whose holder is a dead process on this host is
stale and is taken over; a lock held from another host is never broken automatically
(pass ``break_lock=True`` once you know that writer is gone).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import uuid
from pathlib import Path

from ..errors import WriterLockedError
from .commit import write_all

LOCK_NAME = "writer.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WriterLock:
    """An exclusive, stale-aware lock file in a segment directory."""

    def __init__(self, segment_dir: Path):
        self.path = Path(segment_dir) / LOCK_NAME
        self.token = uuid.uuid4().hex
        self.held = False

    def holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            # A writer killed between O_EXCL-create and write leaves an empty file.
            return {"host": socket.gethostname(), "pid": -1, "token": "", "time": 0}

    def _is_stale(self, info: dict) -> bool:
        if info.get("host") != socket.gethostname():
            return False
        pid = int(info.get("pid", -1))
        return pid <= 0 or (pid != os.getpid() and not _pid_alive(pid))

    def acquire(self, break_lock: bool = False) -> None:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "token": self.token}
        for _ in range(5):
            try:
                self._create(json.dumps({**me, "time": time.time()}).encode())
            except FileExistsError:
                info = self._break_if_stale(break_lock)
                if info is None:
                    continue  # gone, or broken: try to create it again
                raise WriterLockedError(
                    f"segment {self.path.parent} is being written by pid {info.get('pid')} on "
                    f"host {info.get('host')!r} (lock {self.path}). Use another writer_id, "
                    "open it read-only with zreplay.open(), or, if that writer is gone, "
                    "pass break_lock=True"
                ) from None
            self.held = True
            return
        raise WriterLockedError(f"could not take the writer lock {self.path}; retry")

    def _create(self, data: bytes) -> None:
        """Create the lock file holding ``data``, or raise FileExistsError.

        Written aside and hard-linked into place, so the lock never exists empty: an
        empty lock would look like a writer killed mid-create (stale) to another process.
        """
        tmp = self.path.with_name(f"{LOCK_NAME}.{self.token}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                raise
            except OSError:  # no hard links here: create in place (brief empty window)
                self._create_in_place(data)
        except OSError as e:
            if isinstance(e, FileExistsError):
                raise
            raise OSError(e.errno, e.strerror, str(self.path)) from e
        finally:
            tmp.unlink(missing_ok=True)

    def _create_in_place(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            self.path.unlink(missing_ok=True)  # never leave a half-written lock behind
            raise

    def _break_if_stale(self, break_lock: bool) -> dict | None:
        """Remove the lock if it is stale (or ``break_lock``); else return its holder.

        Judged and removed under a guard flock: otherwise two processes that both found
        the same stale lock could each remove it, the second removing the fresh lock the
        first had just made, and both would write the segment (seen with 6 processes).
        """
        guard = self.path.with_name(LOCK_NAME + ".guard")
        try:
            fd = os.open(guard, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            fd = None  # read-only or odd filesystem: judge without the guard
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except OSError:
                    pass  # no flock here (some network filesystems)
            info = self.holder()
            if info is not None and (break_lock or self._is_stale(info)):
                self.path.unlink(missing_ok=True)
                return None
            return info
        finally:
            if fd is not None:
                os.close(fd)  # releases the flock

    def live_holder(self) -> dict | None:
        """The holder of this lock if it may still be writing (not stale), else None."""
        info = self.holder()
        if info is None or self._is_stale(info):
            return None
        return info

    def release(self) -> None:
        if not self.held:
            return
        info = self.holder()
        if info is not None and info.get("token") == self.token:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
        self.held = False
