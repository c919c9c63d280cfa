"""Episodes in an HDF5 file: :func:`write_hdf5`, :func:`iter_hdf5`, :func:`hdf5_info`
(``zreplay.dump(..., format="hdf5")`` and ``zreplay.load_hdf5`` use them).

HDF5 layout (one file, written through h5py; compatible in spirit with
stable-worldmodel's ``hdf5`` format: one dataset per column plus episode offsets):

* ``/<column path>``: ``[total_steps, *step_shape]`` of the column's dtype, chunked along
  steps (about 1 MiB per chunk) and compressed (gzip level 4 after byte shuffle);
* ``/ep_len``, ``/ep_offset`` (int64): length and first step of each episode;
* ``/ep_terminated``, ``/ep_truncated`` (bool): how each episode ended;
* root attribute ``zreplay`` = JSON ``{"format": "hdf5-episodes", "version": 1, "columns": [...]}``.

``mode="overwrite"`` writes a temporary file beside ``path`` and renames it in (an
interrupted dump never leaves a half file under the name); ``"append"`` extends an
existing file with the same columns; ``"error"`` refuses an existing path.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError, SchemaError
from ..schema import unflatten

MODES = ("overwrite", "append", "error")
EPISODE_DATASETS = ("ep_len", "ep_offset", "ep_terminated", "ep_truncated")
CHUNK_BYTES = 1 << 20
READ_BYTES = 64 << 20


# -- HDF5 ----------------------------------------------------------------------------


def write_hdf5(
    batches: Iterable[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
    path: Path,
    mode: str,
    compression: str | None = "gzip",
    level: int = 4,
) -> None:
    """Write batches of episodes ``(columns [steps, ...], {"length", "terminated",
    "truncated"} per episode)`` to ``path`` (``mode``: see the module docstring); each
    batch is one resize and one write per dataset (see :class:`_Column`)."""
    import h5py

    if mode == "append" and path.exists():
        target, f = path, h5py.File(path, "a")
        columns = _hdf5_columns(f, path)
    else:
        target = path.with_name(f".{path.name}.partial-{os.getpid()}")
        f = h5py.File(target, "w")
        columns = None
    writers: dict[str, _Column] = {}
    pool = ThreadPoolExecutor(os.cpu_count() or 2, thread_name_prefix="zreplay-h5")
    try:
        for cols, table in batches:
            if columns is None:
                columns = sorted(cols)
                for name in columns:
                    if name in EPISODE_DATASETS:
                        raise SchemaError(
                            f"column {name!r} collides with an HDF5 episode dataset name"
                        )
                    _create(f, name, cols[name], compression, level)
                for name, dtype in zip(EPISODE_DATASETS, ("i8", "i8", "?", "?"), strict=True):
                    f.create_dataset(
                        name, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(4096,)
                    )
                f.attrs["zreplay"] = json.dumps(
                    {"format": "hdf5-episodes", "version": 1, "columns": columns}
                )
            elif sorted(cols) != columns:
                raise SchemaError(
                    f"{path}: columns {sorted(cols)} differ from the file's {columns}"
                )
            if not writers:
                writers = {name: _Column(f[name], pool) for name in columns}
            start = writers[columns[0]].rows
            for name in columns:
                writers[name].append(cols[name], path, name)
            lengths = np.asarray(table["length"], np.int64)
            offsets = start + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            values = (lengths, offsets, table["terminated"], table["truncated"])
            for name, value in zip(EPISODE_DATASETS, values, strict=True):
                ds = f[name]
                n0 = ds.shape[0]
                ds.resize(n0 + len(value), axis=0)
                ds[n0:] = value
        for w in writers.values():
            w.close()
        if columns is None and "zreplay" not in f.attrs:
            f.attrs["zreplay"] = json.dumps(
                {"format": "hdf5-episodes", "version": 1, "columns": []}
            )
        f.flush()
    except BaseException:
        pool.shutdown(cancel_futures=True)
        f.close()
        if target != path:
            target.unlink(missing_ok=True)
        raise
    pool.shutdown()
    f.close()
    if target != path:
        os.replace(target, path)


def _create(f, name: str, sample: np.ndarray, compression, level: int) -> None:
    row = sample.shape[1:]
    row_bytes = max(1, int(np.prod(row, dtype=np.int64)) * sample.dtype.itemsize)
    chunk = max(1, min(65536, CHUNK_BYTES // row_bytes))
    kw = {}
    if compression:
        kw = {"compression": compression, "shuffle": True}
        if compression == "gzip":
            kw["compression_opts"] = level
    f.create_dataset(
        name, shape=(0, *row), maxshape=(None, *row), dtype=sample.dtype, chunks=(chunk, *row), **kw
    )


class _Column:
    """Appends rows to one dataset chunked along rows: whole chunks are compressed on a
    thread pool (zlib releases the GIL) and stored with ``write_direct_chunk``, exactly
    the bytes HDF5's own shuffle + deflate pipeline would store; rows short of a whole
    chunk wait for the next batch (or :meth:`close`).  Datasets with other filters
    (lzf, szip, ...) get one plain ``ds[a:b] = rows`` per batch instead."""

    def __init__(self, ds, pool: ThreadPoolExecutor):
        self.ds, self.pool = ds, pool
        self.rows = int(ds.shape[0])
        self.chunk = int(ds.chunks[0]) if ds.chunks else 0
        direct = (
            self.chunk
            and ds.chunks[1:] == ds.shape[1:]
            and ds.compression in (None, "gzip")
            and not ds.fletcher32
            and ds.scaleoffset is None
        )
        self.direct = bool(direct)
        self.level = int(ds.compression_opts or 0) if ds.compression == "gzip" else None
        self.shuffle = bool(ds.shuffle) and ds.dtype.itemsize > 1
        self.pending: list = []
        # Rows of a partly filled last chunk already in the file are rewritten with it.
        self.written = self.rows - self.rows % self.chunk if self.direct else self.rows
        self.tail = ds[self.written : self.rows] if self.direct else None

    def append(self, rows: np.ndarray, path, name: str) -> None:
        ds = self.ds
        if ds.shape[1:] != rows.shape[1:] or ds.dtype != rows.dtype:
            raise SchemaError(
                f"{path}: column {name!r} is {ds.dtype}{ds.shape[1:]} in the file, "
                f"{rows.dtype}{rows.shape[1:]} here"
            )
        n = len(rows)
        ds.resize(self.rows + n, axis=0)
        self.rows += n
        if not self.direct:
            ds[self.rows - n : self.rows] = rows
            return
        if len(self.tail):
            rows = np.concatenate([self.tail, rows])
        whole = len(rows) - len(rows) % self.chunk
        for a in range(0, whole, self.chunk):
            self._submit(self.written + a, rows[a : a + self.chunk])
        self.written += whole
        self.tail = rows[whole:].copy()
        self._drain(limit=2 * (os.cpu_count() or 2))

    def close(self) -> None:
        if self.direct and len(self.tail):
            full = np.zeros((self.chunk, *self.ds.shape[1:]), self.ds.dtype)
            full[: len(self.tail)] = self.tail
            self._submit(self.written, full)
        self._drain(limit=0)

    def _submit(self, row: int, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block)
        self.pending.append((row, self.pool.submit(_encode, block, self.shuffle, self.level)))

    def _drain(self, limit: int) -> None:
        offset = (0,) * (self.ds.ndim - 1)
        while len(self.pending) > limit:
            row, fut = self.pending.pop(0)
            self.ds.id.write_direct_chunk((row, *offset), fut.result())


def _encode(block: np.ndarray, shuffle: bool, level: int | None) -> bytes:
    """A chunk as HDF5 stores it: byte shuffle (H5Z_FILTER_SHUFFLE) then deflate (zlib
    format, as H5Z_FILTER_DEFLATE writes it; ``level`` None: no compression)."""
    size = block.dtype.itemsize
    raw = block.view(np.uint8).reshape(-1, size).T.tobytes() if shuffle else block.tobytes()
    return raw if level is None else zlib.compress(raw, level)


def _hdf5_columns(f, path) -> list[str]:
    try:
        meta = json.loads(f.attrs["zreplay"])
        if meta.get("format") != "hdf5-episodes":
            raise ValueError(meta.get("format"))
        return list(meta["columns"])
    except (KeyError, ValueError, TypeError) as e:
        f.close()
        raise FormatError(f"{path} is not a zreplay HDF5 episode file ({e!r})") from None


def iter_hdf5(path: str | Path) -> Iterator[dict[str, np.ndarray]]:
    """Episodes of a zreplay HDF5 file, as nested ``{column: [L, ...]}`` arrays."""
    import h5py

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such HDF5 file")
    with h5py.File(path, "r") as f:
        columns = _hdf5_columns(f, path)
        if not columns:
            return
        lens, offs = f["ep_len"][:].astype(np.int64), f["ep_offset"][:].astype(np.int64)
        # Consecutive episodes are read together, ~READ_BYTES per batch: one read per
        # column decompresses each chunk once instead of once per episode it holds.
        row_bytes = sum(max(1, f[c].dtype.itemsize * int(np.prod(f[c].shape[1:]))) for c in columns)
        i = 0
        while i < len(lens):
            j = i + max(
                1, int(np.searchsorted(np.cumsum(lens[i:]) * row_bytes, READ_BYTES, "right"))
            )
            if np.all(offs[i + 1 : j] == (offs + lens)[i : j - 1]):
                a, b = int(offs[i]), int(offs[j - 1] + lens[j - 1])
                block = {c: f[c][a:b] for c in columns}
                for o, n in zip(offs[i:j] - a, lens[i:j], strict=True):
                    yield unflatten({c: v[o : o + n] for c, v in block.items()})
            else:
                j = i + 1
                yield unflatten({c: f[c][offs[i] : offs[i] + lens[i]] for c in columns})
            i = j


def hdf5_info(path: str | Path) -> dict[str, Any]:
    import h5py

    with h5py.File(path, "r") as f:
        columns = _hdf5_columns(f, path)
        lens = f["ep_len"][:] if columns else np.zeros(0, np.int64)
        return {
            "columns": columns,
            "episodes": len(lens),
            "steps": int(lens.sum()),
            "max_episode_len": int(lens.max(initial=0)),
        }
