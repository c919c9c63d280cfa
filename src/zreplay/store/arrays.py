"""Array handles: one Zarr array of a segment, whichever library moves its bytes.

:class:`ArrayHandle` follows an array's growth (reopening it when another handle grew it)
and is what segments and priorities read and write through.  Which library opens the
array is the backend's choice (``Backend.open_array``): TensorStore for local files,
zarr-python (:class:`ZarrArray`, the subset of a TensorStore handle zreplay uses) for
object stores and for processes forked from another one (TensorStore aborts there).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import zarr

from ..errors import CorruptBufferError, ZReplayError
from ..forks import at_fork

# TensorStore aborts a forked child that touches it ("fork() use detected"); zarr-python
# resets its event loop after a fork.  So a process forked from another (DataLoader workers
# under the default "fork" start method) reads through zarr-python instead (see
# ``forks.forked``): same files, same checksums, slower per call.
_ZARR_RETRIES = 8


class ArrayHandle:
    """A handle on one Zarr array that can follow the array's growth."""

    def __init__(self, path, context, writable: bool, expect: tuple | None = None):
        """``expect``: ``(dtype, row_shape)`` the schema says the array has; an array whose
        metadata says otherwise is damage (CorruptBufferError), never read as it says."""
        self.path = path
        self._context = context
        self._writable = writable
        self._expect = expect
        self._lock = threading.Lock()
        self.fills_missing = True  # set by _open
        self.store = self._open()

    def _open(self):
        try:
            store, self.fills_missing = self.path.backend.open_array(
                self.path, self._writable, self._context
            )
        except ZReplayError:
            raise
        except Exception as e:  # noqa: BLE001 - TensorStore/zarr/fsspec raise many kinds
            raise CorruptBufferError(f"cannot open array {self.path}: {e}") from None
        if self._expect is not None:
            dtype, row = np.dtype(self._expect[0]), tuple(self._expect[1])
            got = np.dtype(getattr(store.dtype, "numpy_dtype", store.dtype))
            if got != dtype or tuple(store.shape[1:]) != row:
                raise CorruptBufferError(
                    f"{self.path / 'zarr.json'}: {got} rows of shape {tuple(store.shape[1:])}, "
                    f"but the root records {dtype} {row}; the array's metadata is damaged "
                    "(restore it from a checkpoint)"
                )
        return store

    @property
    def rows(self) -> int:
        return int(self.store.shape[0])

    def reopen_if_short(self, rows_needed: int):
        """Return a handle covering ``rows_needed`` rows (another handle may have grown
        it); shorter only if the array on disk is (the caller reports the damage)."""
        store = self.store
        if rows_needed > store.shape[0]:
            with self._lock:
                if rows_needed > self.store.shape[0]:
                    self.store = self._reopen(rows_needed)
                store = self.store
        return store

    def _reopen(self, rows_needed: int):
        store = self._open()
        if self._writable or store.shape[0] < rows_needed:
            return store
        # An array is exactly as long as its last commit, so a reader following a writer
        # would reopen every array at every commit.  Readers read committed rows only:
        # the handle may take the array for longer than it is (no I/O), and is reopened
        # (and checked against the array's length) once commits pass that, as when
        # capacity doubled.
        return self.path.backend.widened(store, 2 * rows_needed, self._context)

    def write_held(self, start: int, rows: np.ndarray):
        """Writer only: start writing ``rows`` at row ``start``; returns the write's
        future.  ``rows`` stay unchanged until it is done (the backend may write straight
        from them)."""
        return self.path.backend.write_held(self.store, start, rows, self._context)

    def start_resize(self, rows: int):
        """Writer only: start making the array exactly ``rows`` rows long (its metadata
        only: no chunk is written or deleted); returns what :meth:`finish_resize` waits
        for, or None when it has that length already."""
        if rows == self.rows:
            return None
        shape = list(self.store.shape)
        shape[0] = rows
        return self.store.resize(exclusive_max=shape, resize_metadata_only=True)

    def finish_resize(self, pending) -> None:
        store = pending.result()
        with self._lock:
            self.store = store


class ZarrArray:
    """The subset of a TensorStore handle zreplay uses (``shape``, ``[sel].read()``,
    ``[sel].write(v)``, ``resize``) over zarr-python, for forked processes (reads only)
    and object stores.  Reads and writes run on a small thread pool, so several keys are
    in flight at once as with TensorStore."""

    def __init__(self, path, writable: bool = False):
        store = path.backend.zarr_store(path, read_only=not writable)
        arr = zarr.open_array(store, mode="r+" if writable else "r")
        # write_empty_chunks is not stored with the array: all-zero chunks must be stored
        # too (a missing chunk is damage; see format.STORED_ATTRS).
        self._arr = arr.with_config({"write_empty_chunks": True}) if writable else arr
        self.shape = self._arr.shape
        self.dtype = np.dtype(self._arr.dtype)

    def __getitem__(self, sel) -> ZarrIO:
        return ZarrIO(self._arr, sel)

    def widened(self, rows: int) -> ZarrArray:
        """A reader of the same array taken as ``rows`` rows long, without reading or
        writing its metadata (see ``Backend.widened``)."""
        from zarr.core.array import Array, AsyncArray

        arr = self._arr
        meta = dataclasses.replace(arr.metadata, shape=(int(rows), *arr.shape[1:]))
        out = object.__new__(ZarrArray)
        out._arr = Array(AsyncArray(meta, arr.store_path, config=arr.async_array.config))
        out.shape, out.dtype = out._arr.shape, self.dtype
        return out

    def resize(self, exclusive_max, **_ignored) -> Future:
        return _submit(self._resize, tuple(exclusive_max))

    def _resize(self, shape: tuple) -> ZarrArray:
        # zarr-python also deletes the chunks a shorter shape leaves out: only rows past
        # the commit (garbage) are ever cut off.
        self._arr.resize(shape)
        self.shape = self._arr.shape
        return self


_POOL: ThreadPoolExecutor | None = None


def _forget_pool() -> None:
    global _POOL
    _POOL = None  # threads do not survive a fork: a forked child starts its own


at_fork(_forget_pool)


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(4, thread_name_prefix="zreplay-io")
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
                    return self._points(self._sel)
                return self._arr[self._sel]
            except Exception:  # noqa: BLE001 - re-raised on the last attempt
                if attempt == _ZARR_RETRIES - 1:
                    raise
                time.sleep(0.001 * (attempt + 1))
        raise AssertionError("unreachable")

    def _points(self, rows: np.ndarray) -> np.ndarray:
        # As TensorStore: rows in any order, repeats allowed (zarr wants them sorted).
        if len(rows) < 2 or bool(np.all(np.diff(rows) > 0)):
            return self._arr.get_orthogonal_selection((rows,))
        uniq, inv = np.unique(rows, return_inverse=True)
        return self._arr.get_orthogonal_selection((uniq,))[inv.reshape(-1)]
