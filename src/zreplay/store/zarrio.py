"""Array I/O through zarr-python, for where TensorStore cannot go.

Two places: a process forked from another (TensorStore aborts there; DataLoader workers
under the default "fork" start method), which only reads, and buffers in an object store
(through zarr's fsspec store and s3fs), which read and write.  :class:`ZarrArray` offers
the subset of a TensorStore handle the segment code uses, so the rest of the store layer
does not care which library moves the bytes.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import zarr

from .location import Location, zarr_store

# TensorStore aborts a forked child that touches it ("fork() use detected"); zarr-python
# resets its event loop after a fork.  So a process forked from another (DataLoader workers
# under the default "fork" start method) reads through zarr-python instead: same files,
# same checksums, slower per call.
_FORKED = False
_ZARR_RETRIES = 8


def _mark_forked() -> None:
    global _FORKED
    _FORKED = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


def forked() -> bool:
    """True in a process forked from another one (TensorStore must not be used)."""
    return _FORKED


class ZarrArray:
    """The subset of a TensorStore handle zreplay uses (``shape``, ``[sel].read()``,
    ``[sel].write(v)``, ``resize``) over zarr-python: for forked processes (reads only)
    and for object stores (through zarr's fsspec store).  Reads and writes run on a small
    thread pool, so several keys are in flight at once as with TensorStore."""

    def __init__(self, path: Location, writable: bool = False):
        arr = zarr.open_array(
            zarr_store(path, read_only=not writable), mode="r+" if writable else "r"
        )
        # write_empty_chunks is not stored with the array: all-zero chunks must be stored
        # too (a missing chunk is damage; see STORED_ATTRS).
        self._arr = arr.with_config({"write_empty_chunks": True}) if writable else arr
        self.shape = self._arr.shape

    def __getitem__(self, sel) -> ZarrIO:
        return ZarrIO(self._arr, sel)

    def resize(self, exclusive_max, **_ignored) -> Future:
        self._arr.resize(tuple(exclusive_max))
        self.shape = self._arr.shape
        return _done(self)


_POOL: ThreadPoolExecutor | None = None
_POOL_PID = 0


def _pool() -> ThreadPoolExecutor:
    global _POOL, _POOL_PID
    if _POOL is None or _POOL_PID != os.getpid():  # threads do not survive a fork
        _POOL, _POOL_PID = ThreadPoolExecutor(4, thread_name_prefix="zreplay-io"), os.getpid()
    return _POOL


def _submit(fn, *args) -> Future:
    try:
        return _pool().submit(fn, *args)
    except RuntimeError:  # interpreter shutdown (buffers closed at exit): run inline
        return _done(fn(*args))


def _done(value) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


class ZarrIO:
    def __init__(self, arr, sel):
        self._arr, self._sel = arr, sel

    def read(self) -> Future:
        return _submit(self._read)

    def write(self, value: np.ndarray) -> Future:
        return _submit(self._arr.__setitem__, self._sel, value)

    def _read(self) -> np.ndarray:
        # zarr-python reads a shard's index and then its chunks with separate opens: if the
        # writer replaces the shard file in between (it rewrites the shard holding the
        # newest rows), the old index meets the new file and the checksum fails.  The
        # replacement is atomic, so a re-read sees one consistent file; damage persists.
        for attempt in range(_ZARR_RETRIES):
            try:
                if isinstance(self._sel, np.ndarray):
                    return self._arr.get_orthogonal_selection((self._sel,))
                return self._arr[self._sel]
            except Exception:  # noqa: BLE001 - re-raised on the last attempt
                if attempt == _ZARR_RETRIES - 1:
                    raise
                time.sleep(0.001 * (attempt + 1))
        raise AssertionError("unreachable")
