"""Episodes in an HDF5 file: :func:`write_hdf5`, :func:`iter_hdf5`, :func:`hdf5_info`
(``zreplay.dump(..., format="hdf5")`` and ``zreplay.load_hdf5`` use them).

The layout is stable-worldmodel's ``hdf5`` format, so its ``HDF5Dataset`` /
``load_dataset`` read a zreplay dump as they read their own files:

* ``/<column>``: ``[total_steps, *step_shape]`` of the column's dtype; every root
  dataset other than ``ep_len``/``ep_offset`` is a per-step column;
* ``/ep_len`` (int32), ``/ep_offset`` (int64): length and first step of each episode
  (present, empty, in a dump of no episodes);
* root attribute ``zreplay`` = JSON ``{"format": "hdf5-episodes", "version": 2,
  "columns": [key paths], "datasets": [names]}``.

What zreplay does differently from stable-worldmodel's writer: columns are chunked along
steps (about 1 MiB per chunk) and compressed (gzip level 4 after byte shuffle; whole
chunks are compressed on a thread pool and stored as they are, :class:`_Column`) where it
writes one uncompressed step per chunk; nested keys (``obs/state``) are stored as one root
dataset each, named with ``.`` (``obs.state``: stable-worldmodel reads a group as a broken
column), and the ``zreplay`` attribute maps them back; how an episode ended is not stored
(the flags are the last step's ``terminated``/``truncated`` columns, as when it was
added).  ``mode="overwrite"`` writes a temporary file beside ``path`` and renames it in (an
interrupted dump never leaves a half file under the name, and the next dump to ``path``
removes what a killed one left); ``"append"`` extends an
existing file with the same columns, in place (an append that raises, Ctrl-C
included, is rolled back: the file holds what it held before; a crash in the middle can
leave it damaged, as HDF5 keeps no journal); ``"error"`` refuses an existing path.

Readers take zreplay's files (version 2, and version 1 with ``ep_terminated`` /
``ep_truncated`` datasets and nested keys as groups) and stable-worldmodel's (no
attribute: every root dataset but ``ep_len``/``ep_offset`` is a column).
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

from ..conventions import TERMINATION_KEYS, TRUNCATION_KEYS
from ..errors import FormatError, SchemaError
from ..schema import unflatten
from ..store import liveness
from ..store.backend_local import fsync_dir
from ..store.localswap import PARTIAL, remove_leftovers, stage_name

MODES = ("append", "overwrite", "error")  # stable-worldmodel's WRITE_MODES, in its order
EPISODE_DATASETS = ("ep_len", "ep_offset")
LEGACY_FLAGS = ("ep_terminated", "ep_truncated")  # version 1 files only
CHUNK_BYTES = 1 << 20
READ_BYTES = 64 << 20
VERSION = 2


def dataset_name(path: str) -> str:
    """The root dataset of column ``path`` (``obs/state`` -> ``obs.state``)."""
    return path.replace("/", ".")


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

    before = held = None
    if mode == "append" and path.exists():
        target, f = path, h5py.File(path, "a")
        try:
            columns, names = layout(f, path)
            before = _extent(f)
        except BaseException:
            f.close()
            raise
    else:
        path.parent.mkdir(parents=True, exist_ok=True)  # as RLinf exports and swm's writer do
        remove_leftovers(path)  # partial files of dumps killed midway
        target = stage_name(path, PARTIAL)
        # Our flock on it, kept until it is in place (through the close, the fsync and
        # the rename: HDF5's own lock ends at the close), is what tells another dump this
        # partial file is no dead one's leftover, whatever PID namespace it runs in.
        target.touch(exist_ok=False)
        held = liveness.hold(target)
        try:
            f = h5py.File(target, "w", locking=False)
        except BaseException:
            if held is not None:
                held.release()
            target.unlink(missing_ok=True)
            raise
        columns = names = None
    columns, names = (columns, names) if columns else (None, None)  # an empty file
    writers: dict[str, _Column] = {}
    pool = ThreadPoolExecutor(os.cpu_count() or 2, thread_name_prefix="zreplay-h5")
    try:
        if "ep_len" not in f:
            f.create_dataset("ep_len", shape=(0,), maxshape=(None,), dtype="i4", chunks=(4096,))
            f.create_dataset("ep_offset", shape=(0,), maxshape=(None,), dtype="i8", chunks=(4096,))
        if columns is None and "zreplay" not in f.attrs:
            _set_meta(f, [], [])
        legacy = [n for n in LEGACY_FLAGS if n in f]
        for cols, table in batches:
            if columns is None:
                columns, names = _create_columns(f, cols, compression, level)
            elif sorted(cols) != sorted(columns):
                raise SchemaError(
                    f"{path}: columns {sorted(cols)} differ from the file's {sorted(columns)}"
                )
            if not writers:
                writers = {name: _Column(f[name], pool) for name in names}
            start = writers[names[0]].rows
            for col, name in zip(columns, names, strict=True):
                writers[name].append(cols[col], path, col)
            lengths = np.asarray(table["length"], np.int64)
            offsets = start + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            values = {"ep_len": lengths, "ep_offset": offsets}
            values.update(zip(LEGACY_FLAGS, (table["terminated"], table["truncated"]), strict=True))
            for name in [*EPISODE_DATASETS, *legacy]:
                ds, value = f[name], values[name]
                n0 = ds.shape[0]
                ds.resize(n0 + len(value), axis=0)
                ds[n0:] = value
        for w in writers.values():
            w.close()
        f.flush()
    except BaseException:
        pool.shutdown(cancel_futures=True)
        try:
            if before is not None:
                _roll_back(f, before)
        finally:
            f.close()
            if target != path:
                target.unlink(missing_ok=True)
            if held is not None:
                held.release()
        raise
    pool.shutdown()
    f.close()
    try:
        if target != path:
            _put_in_place(target, path)
    finally:
        if held is not None:
            held.release()


def _extent(f) -> tuple[dict[str, int], dict[str, Any]]:
    """Rows of every root dataset and the root attributes: what an append rolls back to."""
    import h5py

    rows = {k: int(v.shape[0]) for k, v in f.items() if isinstance(v, h5py.Dataset)}
    return rows, dict(f.attrs)


def _roll_back(f, before: tuple[dict[str, int], dict[str, Any]]) -> None:
    """Put an append that failed back: datasets cut to their rows before it (rows of a
    rewritten last chunk are the same bytes), new ones removed, attributes restored."""
    import h5py

    rows, attrs = before
    for name, node in list(f.items()):
        if name not in rows:
            del f[name]
        elif isinstance(node, h5py.Dataset) and node.shape[0] != rows[name]:
            node.resize(rows[name], axis=0)
    for key in set(f.attrs) - set(attrs):
        del f.attrs[key]
    for key, value in attrs.items():
        f.attrs[key] = value
    f.flush()


def _put_in_place(built: Path, path: Path) -> None:
    """The file built aside replaces ``path`` in one step (durably: data, then name)."""
    with open(built, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(built, path)
    fsync_dir(path.parent)


def _create_columns(f, cols: dict[str, np.ndarray], compression, level: int):
    columns = list(cols)  # in the source's order (the first episode's, for swm buffers)
    names = [dataset_name(c) for c in columns]
    clash = {n for n in names if names.count(n) > 1} | set(names) & {*EPISODE_DATASETS}
    if clash:
        raise SchemaError(
            f"columns {columns} cannot all be root datasets of an HDF5 episode file: "
            f"{sorted(clash)} would collide (nested keys are named with '.'; ep_len and "
            "ep_offset are the episode table); rename the keys"
        )
    for col, name in zip(columns, names, strict=True):
        _create(f, name, cols[col], compression, level)
    _set_meta(f, columns, names)
    return columns, names


def _set_meta(f, columns: list[str], names: list[str]) -> None:
    f.attrs["zreplay"] = json.dumps(
        {"format": "hdf5-episodes", "version": VERSION, "columns": columns, "datasets": names}
    )


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


def layout(f, path) -> tuple[list[str], list[str]]:
    """``(column key paths, their dataset names)`` of an open episode file: zreplay's
    (the ``zreplay`` attribute) or stable-worldmodel's (``ep_len``/``ep_offset`` and a
    dataset per column)."""
    import h5py

    if "zreplay" in f.attrs:
        try:
            meta = json.loads(f.attrs["zreplay"])
            if meta.get("format") != "hdf5-episodes" or meta.get("version", 1) > VERSION:
                raise ValueError(meta.get("format"), meta.get("version"))
            columns = list(meta["columns"])
            return columns, list(meta.get("datasets", columns))
        except (KeyError, ValueError, TypeError) as e:
            raise FormatError(f"{path} is not a zreplay HDF5 episode file ({e!r})") from None
    if not all(k in f for k in EPISODE_DATASETS):
        raise FormatError(
            f"{path} is not an HDF5 episode file: neither zreplay's (no 'zreplay' attribute) "
            "nor stable-worldmodel's (no ep_len/ep_offset datasets)"
        )
    names = [k for k in f.keys() if k not in EPISODE_DATASETS]
    for k in names:
        ds = f[k]
        if not isinstance(ds, h5py.Dataset) or ds.dtype.kind not in "biuf":
            raise FormatError(
                f"{path}: column {k!r} is not a numeric or boolean dataset; zreplay stores "
                "numeric per-step columns only"
            )
    return names, names


def episode_index(f, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(ep_len, ep_offset)`` of an open episode file whose column datasets are
    ``names``, checked before a step is read: every episode has at least one step, lies
    inside the columns, which are equally long, and no two overlap, and together they
    cover every step.  A file from elsewhere may say otherwise, and slicing HDF5 would
    then drop, repeat or cut episodes silently; FormatError naming the file instead."""
    if not all(k in f for k in EPISODE_DATASETS):
        if not names:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        _bad_index(f, "the file has columns but no ep_len/ep_offset datasets")
    lens_ds, offs_ds = f["ep_len"], f["ep_offset"]
    for ds in (lens_ds, offs_ds):
        if getattr(ds, "ndim", None) != 1 or ds.dtype.kind not in "iu":
            _bad_index(f, f"{ds.name} is not a 1-d integer dataset")
    rows = {int(f[d].shape[0]) if f[d].ndim else -1 for d in names}
    if len(rows) > 1:
        _bad_index(f, f"its columns have different numbers of steps ({sorted(rows)})")
    steps = max(rows.pop(), 0) if rows else 0
    # Sizes first: an index longer than the steps (one at least per episode) is not read.
    n = lens_ds.shape[0]
    if n != offs_ds.shape[0]:
        _bad_index(f, f"{n} ep_len entries but {offs_ds.shape[0]} ep_offset entries")
    if n > steps:
        _bad_index(f, f"{n} episodes in columns of {steps} steps")
    lens, offs = lens_ds[:].astype(np.int64), offs_ds[:].astype(np.int64)
    if not n:
        if steps:
            _bad_index(f, f"no episodes, but columns of {steps} steps")
        return lens, offs
    if lens.min() < 1:
        _bad_index(f, f"episode {int(np.argmin(lens))} has {int(lens.min())} steps")
    outside = np.flatnonzero((offs < 0) | (offs > steps - lens))
    if outside.size:
        e = int(outside[0])
        _bad_index(f, f"episode {e} is steps [{offs[e]}, {offs[e] + lens[e]}) of {steps}")
    order = np.argsort(offs, kind="stable")
    overlap = np.flatnonzero(offs[order][1:] < (offs + lens)[order][:-1])
    if overlap.size:
        a, b = int(order[overlap[0]]), int(order[overlap[0] + 1])
        _bad_index(f, f"episodes {a} and {b} share step {offs[b]}")
    if int(lens.sum()) != steps:
        _bad_index(f, f"its episodes cover {int(lens.sum())} of the {steps} steps")
    return lens, offs


def _bad_index(f, problem: str):
    raise FormatError(
        f"{f.filename}: the episode index (ep_len, ep_offset) is inconsistent: {problem}; "
        "the file is damaged or was not written by zreplay or stable-worldmodel (nothing "
        "was read from it: write it again from its source)"
    )


def iter_hdf5(path: str | Path) -> Iterator[dict[str, np.ndarray]]:
    """Episodes of a zreplay (or stable-worldmodel) HDF5 episode file, as nested
    ``{column: [L, ...]}`` arrays."""
    import h5py

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such HDF5 file")
    with h5py.File(path, "r") as f:
        columns, names = layout(f, path)
        if not columns:
            return
        lens, offs = episode_index(f, names)
        # Consecutive episodes are read together, ~READ_BYTES per batch: one read per
        # column decompresses each chunk once instead of once per episode it holds.
        row_bytes = sum(max(1, f[d].dtype.itemsize * int(np.prod(f[d].shape[1:]))) for d in names)
        pairs, i = list(zip(columns, names, strict=True)), 0
        while i < len(lens):
            j = i + max(
                1, int(np.searchsorted(np.cumsum(lens[i:]) * row_bytes, READ_BYTES, "right"))
            )
            if np.all(offs[i + 1 : j] == (offs + lens)[i : j - 1]):
                a, b = int(offs[i]), int(offs[j - 1] + lens[j - 1])
                block = {c: f[d][a:b] for c, d in pairs}
                for o, n in zip(offs[i:j] - a, lens[i:j], strict=True):
                    yield unflatten({c: v[o : o + n] for c, v in block.items()})
            else:
                j = i + 1
                yield unflatten({c: f[d][offs[i] : offs[i] + lens[i]] for c, d in pairs})
            i = j


def episode_flags(f, columns: list[str], names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """How each episode of an open file ended: the legacy datasets of a version 1 file,
    else its last step's termination / truncation column (False without one)."""
    lens, offs = episode_index(f, names)
    if all(k in f for k in LEGACY_FLAGS):
        flags = f[LEGACY_FLAGS[0]][:].astype(bool), f[LEGACY_FLAGS[1]][:].astype(bool)
        if any(len(x) != len(lens) for x in flags):
            raise FormatError(f"{f.filename}: {LEGACY_FLAGS} do not have one entry per episode")
        return flags
    last = (offs + lens - 1) if len(lens) else np.zeros(0, np.int64)
    by_path = dict(zip(columns, names, strict=True))
    out = []
    for keys in (TERMINATION_KEYS, TRUNCATION_KEYS):
        name = next((by_path[k] for k in keys if k in by_path), None)
        if name is None or not len(lens):
            out.append(np.zeros(len(lens), bool))
            continue
        rows, back = np.unique(last, return_inverse=True)  # h5py reads increasing indices
        flags = f[name][rows]
        out.append(flags.reshape(len(flags), -1).astype(bool).any(axis=1)[back])
    return out[0], out[1]


def hdf5_info(path: str | Path) -> dict[str, Any]:
    import h5py

    with h5py.File(path, "r") as f:
        columns, names = layout(f, path)
        lens, _ = episode_index(f, names)
        return {
            "columns": columns,
            "datasets": names,
            "episodes": len(lens),
            "steps": int(lens.sum()),
            "max_episode_len": int(lens.max(initial=0)),
        }
