"""Each array's ``zarr.json`` cross-checked with what the buffer recorded (``verify``).

The root records every key's dtype, row shape and layout; a segment's arrays must say
exactly that (an edited ``data_type`` would otherwise read 300.7 as 44), and every
chunk must end with a crc32c checksum (index arrays of segments written before they had
one are reported as warnings).
"""

from __future__ import annotations

import json

import numpy as np

from .format import PIECE_COLUMNS, TRAJ_COLUMNS
from .layout import KeyLayout, chunk_key_separator, shard_key
from .location import Location


def _zarr_dtype(name: str) -> np.dtype:
    return np.dtype("?" if name == "bool" else name)


def _codec_names(codecs: list) -> list[str]:
    return [c.get("name") for c in codecs]


def check_array(
    loc: Location,
    dtype,
    row_shape: tuple,
    layout: KeyLayout | None,
    min_rows: int = 0,
    stored_row: int | None = None,
) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` of the array at ``loc`` against what the root recorded:
    ``dtype``, ``row_shape``, (for data arrays) ``layout``, and at least ``min_rows``
    rows (what a commit needs); with ``stored_row``, that the shard file holding it is
    where the ``zarr.json``'s chunk keys name it."""
    where = f"{loc / 'zarr.json'}"
    try:
        meta = json.loads((loc / "zarr.json").read_bytes())
        got = _zarr_dtype(meta["data_type"])
        shape = [int(x) for x in meta["shape"]]
        grid = [int(x) for x in meta["chunk_grid"]["configuration"]["chunk_shape"]]
        codecs = list(meta["codecs"])
    except FileNotFoundError:
        return [f"cannot open array {loc}: {where} is missing"], []
    except (ValueError, KeyError, TypeError) as e:
        return [f"cannot open array {loc}: {where} is unreadable ({type(e).__name__}: {e})"], []
    problems, warnings = [], []
    if got != np.dtype(dtype) or tuple(shape[1:]) != tuple(row_shape):
        problems.append(
            f"{where}: {got} rows of shape {tuple(shape[1:])}, but the root records "
            f"{np.dtype(dtype)} {tuple(row_shape)}"
        )
    if shape[0] < min_rows:
        problems.append(f"{where}: the array has {shape[0]} rows but the commit needs {min_rows}")
    inner, chain = grid, codecs
    if _codec_names(codecs) == ["sharding_indexed"]:
        cfg = codecs[0].get("configuration", {})
        inner, chain = [int(x) for x in cfg.get("chunk_shape", [])], cfg.get("codecs", [])
    if layout is not None and (grid[0], inner[0]) != (layout.shard_rows, layout.chunk_rows):
        problems.append(
            f"{where}: shards of {grid[0]} rows in chunks of {inner[0]}, but the root "
            f"records {layout.shard_rows} and {layout.chunk_rows}"
        )
    separator = chunk_key_separator(meta)
    if separator is None:
        problems.append(
            f"cannot open array {loc}: {where} names chunks by "
            f"{meta.get('chunk_key_encoding')}, not Zarr's default chunk keys"
        )
    elif stored_row is not None and grid[0] > 0:
        shard = loc / shard_key(separator, stored_row // grid[0], len(shape))
        if not shard.is_file():
            problems.append(f"{loc}: the shard holding row {stored_row} is missing ({shard})")
    if "crc32c" not in _codec_names(chain):
        (problems if layout is not None else warnings).append(
            f"{where}: chunks carry no crc32c checksum (damage to them goes unnoticed)"
        )
    return problems, warnings


def segment_arrays(schema, layouts) -> list[tuple[str, object, tuple, KeyLayout | None]]:
    """``(relative path, dtype, row shape, layout or None)`` of every array of a segment."""
    out = [(f"data/{k}", s.dtype, s.row_shape, layouts[k]) for k, s in schema.specs.items()]
    out.append(("offsets", "int64", (), None))
    out += [(f"traj/{c}", d, r, None) for c, (d, r) in TRAJ_COLUMNS.items()]
    out += [(f"episodes/{c}", d, (), None) for c, d in PIECE_COLUMNS.items()]
    return out
