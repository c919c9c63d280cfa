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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError, SchemaError
from ..schema import unflatten

MODES = ("overwrite", "append", "error")
EPISODE_DATASETS = ("ep_len", "ep_offset", "ep_terminated", "ep_truncated")
CHUNK_BYTES = 1 << 20


# -- HDF5 ----------------------------------------------------------------------------


def write_hdf5(
    items: Iterable[tuple[dict[str, np.ndarray], bool, bool]],
    path: Path,
    mode: str,
    compression: str | None = "gzip",
    level: int = 4,
) -> None:
    """Write ``(columns [L, ...], terminated, truncated)`` episodes to ``path`` (``mode``:
    see the module docstring)."""
    import h5py

    if mode == "append" and path.exists():
        target, f = path, h5py.File(path, "a")
        columns = _hdf5_columns(f, path)
    else:
        target = path.with_name(f".{path.name}.partial-{os.getpid()}")
        f = h5py.File(target, "w")
        columns = None
    try:
        for cols, term, trunc in items:
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
            n = len(next(iter(cols.values())))
            start = int(f[columns[0]].shape[0])
            for name in columns:
                ds = f[name]
                if ds.shape[1:] != cols[name].shape[1:] or ds.dtype != cols[name].dtype:
                    raise SchemaError(
                        f"{path}: column {name!r} is {ds.dtype}{ds.shape[1:]} in the file, "
                        f"{cols[name].dtype}{cols[name].shape[1:]} here"
                    )
                ds.resize(start + n, axis=0)
                ds[start:] = cols[name]
            for name, value in zip(EPISODE_DATASETS, (n, start, term, trunc), strict=True):
                ds = f[name]
                ds.resize(ds.shape[0] + 1, axis=0)
                ds[-1] = value
        if columns is None and "zreplay" not in f.attrs:
            f.attrs["zreplay"] = json.dumps(
                {"format": "hdf5-episodes", "version": 1, "columns": []}
            )
        f.flush()
    except BaseException:
        f.close()
        if target != path:
            target.unlink(missing_ok=True)
        raise
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
        lens, offs = f["ep_len"][:], f["ep_offset"][:]
        for n, o in zip(lens, offs, strict=True):
            yield unflatten({c: f[c][o : o + n] for c in columns})


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
