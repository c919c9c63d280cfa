"""The writer lock of a segment: one writer per segment, failing fast for a second one.

The lock is a file created with O_EXCL (atomic on local filesystems and NFSv3+), holding
``{host, pid, token, time}``.  A lock whose holder is a dead process on this host is
stale and is taken over; a lock held from another host is never broken automatically
(pass ``break_lock=True`` once you know that writer is gone).
"""

from __future__ import annotations

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
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                info = self.holder()
                if info is None:
                    continue
                if break_lock or self._is_stale(info):
                    # Rename first so two processes breaking the same stale lock cannot
                    # both delete a fresh lock the other just created.
                    grave = self.path.with_name(f"{LOCK_NAME}.stale.{self.token}")
                    try:
                        os.replace(self.path, grave)
                        grave.unlink()
                    except FileNotFoundError:
                        pass
                    continue
                raise WriterLockedError(
                    f"segment {self.path.parent} is being written by pid {info.get('pid')} on "
                    f"host {info.get('host')!r} (lock {self.path}). Use another writer_id, "
                    "open it read-only with zreplay.open(), or, if that writer is gone, "
                    "pass break_lock=True"
                ) from None
            try:
                try:
                    write_all(fd, json.dumps({**me, "time": time.time()}).encode())
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as e:
                self.path.unlink(missing_ok=True)  # never leave a half-written lock behind
                raise OSError(e.errno, e.strerror, str(self.path)) from e
            self.held = True
            return
        raise WriterLockedError(f"could not take the writer lock {self.path}; retry")

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
