"""The writer lock of a segment: one writer per segment, failing fast for a second one.

The lock is a file holding ``{host, pid, token, time}``, created exclusively and never seen
empty (written aside and hard-linked into place; a conditional PUT in an object store).
A lock whose holder is a dead process on this host is
stale and is taken over; a lock held from another host is never broken automatically
(pass ``break_lock=True`` once you know that writer is gone).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

from ..errors import WriterLockedError
from .format import legacy_lock_path, lock_path
from .localswap import pid_alive
from .location import Location, locate

# Tokens of the locks lock objects of this process hold.
_HELD_HERE: set[str] = set()


class WriterLock:
    """An exclusive, stale-aware lock file in a segment directory."""

    def __init__(self, segment_dir: Location):
        segment_dir = locate(segment_dir)
        self.path = lock_path(segment_dir)
        # Where format 2 kept the lock: a live holder there (an older zreplay) also counts.
        self._legacy = legacy_lock_path(segment_dir)
        self.token = uuid.uuid4().hex
        self.held = False

    def holder(self, path: Location | None = None) -> dict | None:
        try:
            return json.loads((path or self.path).read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            # Unreadable (an older zreplay could leave it empty): no live holder to name.
            return {"host": socket.gethostname(), "pid": -1, "token": "", "time": 0}

    def _is_stale(self, info: dict) -> bool:
        if info.get("host") != socket.gethostname():
            return False
        pid = int(info.get("pid", -1))
        if pid == os.getpid():  # ours: stale unless a lock object here still holds it
            return info.get("token") not in _HELD_HERE
        return pid <= 0 or not pid_alive(pid)

    def acquire(self, break_lock: bool = False) -> None:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "token": self.token}
        legacy = self.holder(self._legacy)
        if legacy is not None and not break_lock and not self._is_stale(legacy):
            raise self._locked(legacy)
        for _ in range(5):
            try:
                self._create(json.dumps({**me, "time": time.time()}).encode())
            except FileExistsError:
                info = self._break_if_stale(break_lock)
                if info is None:
                    continue  # gone, or broken: try to create it again
                raise self._locked(info) from None
            self.held = True
            _HELD_HERE.add(self.token)
            return
        raise WriterLockedError(f"could not take the writer lock {self.path}; retry")

    def _locked(self, info: dict) -> WriterLockedError:
        return WriterLockedError(
            f"segment {self.path.parent.parent} is being written by pid {info.get('pid')} on "
            f"host {info.get('host')!r} (lock {self.path}). Use another writer_id, "
            "open it read-only with zreplay.open(), or, if that writer is gone, "
            "pass break_lock=True"
        )

    def _create(self, data: bytes) -> None:
        """Create the lock file holding ``data``, or raise FileExistsError.

        Never exists empty: an empty lock would look like a writer killed mid-create
        (stale) to another process.
        """
        if not self.path.backend.create_exclusive(self.path, data):
            raise FileExistsError(str(self.path))

    def _break_if_stale(self, break_lock: bool) -> dict | None:
        """Remove the lock if it is stale (or ``break_lock``); else return its holder.

        Judged and removed under the backend's guard (a flock beside the lock):
        otherwise two processes that both found the same stale lock could each remove it,
        the second removing the fresh lock the first had just made, and both would write
        the segment (seen with 6 processes).
        An object store has no flock; only a dead process on this host makes a lock stale,
        so there the racing breakers are on one host, and two starting at the same moment
        is the one case left open.
        """
        with self.path.backend.guard(self.path):
            info = self.holder()
            if info is not None and (break_lock or self._is_stale(info)):
                self.path.unlink(missing_ok=True)
                return None
            return info

    def live_holder(self) -> dict | None:
        """The holder of this lock (or of a format-2 lock) if it may still be writing (not
        stale), else None."""
        for path in (self.path, self._legacy):
            info = self.holder(path)
            if info is not None and not self._is_stale(info):
                return info
        return None

    def remove_legacy(self) -> None:
        """Remove a format-2 lock file left by a writer that is gone (the caller holds
        this lock, so no live writer of an older zreplay holds that one)."""
        self._legacy.unlink(missing_ok=True)

    def release(self) -> None:
        """Give the lock up.  If removing the file fails (an I/O error), the lock is
        still given up: this process judges a lock file of its own that no lock object
        holds stale, so it may reopen the segment, and other processes once it exits."""
        if not self.held:
            return
        self.held = False
        _HELD_HERE.discard(self.token)
        info = self.holder()
        if info is not None and info.get("token") == self.token:
            self.path.unlink(missing_ok=True)
