"""Re-encode a buffer's keys with another codec (``zreplay upgrade --codec``), all or nothing.

The new buffer is built as a new tree, as :mod:`zreplay.store.upgrade` builds one: every
file but the re-encoded keys' arrays hard-linked (or copied), those arrays created anew
with the new layout and written shard by shard from the committed rows (rows evicted
below a commit's ``low_row`` in its first shard are written as fill values, as a writer
does), each segment's commit written anew with a new contents id (readers that cached
rows drop them: a lossy codec changes them), the schema record and the root's
``zarr.json`` last, with the new layouts; then it is put in place in one step by the
backend (``staged_tree``), the writer lock of every segment held meanwhile.  An
exception or a crash at any point leaves the old buffer or the new one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import SchemaError
from .arrays import ArrayHandle
from .commit import new_contents, read_commit, write_commit
from .format import (
    COMMIT_NAME,
    FORMAT_VERSION,
    LOCK_NAME,
    META,
    SCHEMA_NAME,
    SEGMENTS,
    is_temp_name,
    old_format_error,
)
from .guard import copy_files, new_tree
from .layout import KeyLayout
from .location import Location
from .objectswap import is_staging_name
from .root import BufferRoot
from .segment import Segment


def parse_codec(text: str) -> tuple[str, dict]:
    """``"KEY=CODEC"`` or ``"KEY=CODEC:LEVEL"`` as ``(key, layout override)``."""
    key, sep, codec = text.partition("=")
    name, _, level = codec.partition(":")
    if not sep or not key or not name or (level and not level.lstrip("-").isdigit()):
        raise SchemaError(f"--codec {text!r}: expected KEY=CODEC or KEY=CODEC:LEVEL")
    return key, {"codec": name, **({"level": int(level)} if level else {})}


def recode(
    path: str | Path | Location,
    codecs: Mapping[str, Mapping],
    storage_options: Mapping | None = None,
) -> dict[str, dict]:
    """Re-encode keys of the buffer at ``path`` all or nothing: ``codecs`` maps a key
    path to a layout override (``{"obs/image": {"codec": "jpegxl"}}``; ``level``
    optional).  Returns ``{key: {"from": old layout, "to": new layout}}`` for the keys
    that changed (empty: nothing to do, nothing touched).

    Refused with nothing touched: an older format (upgrade first), an unknown key or a
    codec that cannot store the key (SchemaError), a live writer (WriterLockedError)."""
    root = BufferRoot(path, storage_options)
    root.recover()
    info = root.stored_meta()
    if info.get("format") != FORMAT_VERSION:
        raise old_format_error(root.path, info.get("format"))
    if not _changed(root, info, codecs):
        return {}
    root.backend.check_files(root.path)  # links and FIFOs refused before linking files
    with new_tree(root.path, "zreplay recode") as tmp:
        info = root.stored_meta()  # what is rewritten is read under the locks
        changed = _changed(root, info, codecs)
        schema, layouts = root.schema(info)
        _build(root, info, schema, {**layouts, **changed}, changed, tmp)
    return {k: {"from": vars(layouts[k]), "to": vars(v)} for k, v in changed.items()}


def _changed(root: BufferRoot, info: dict, codecs: Mapping) -> dict[str, KeyLayout]:
    schema, layouts = root.schema(info)
    if schema is None:
        raise SchemaError(f"{root.path}: nothing was written yet; there is nothing to re-encode")
    unknown = sorted(set(codecs) - set(schema.specs))
    if unknown:
        raise SchemaError(f"{root.path} has no key(s) {unknown}; its keys: {sorted(schema.specs)}")
    out = {}
    for key, override in codecs.items():
        new = layouts[key].with_overrides(override)
        new.check_spec(key, schema.specs[key])
        if new != layouts[key]:
            out[key] = new
    return out


def _copied(rel: str, skip: tuple[str, ...]) -> bool:
    """Is the file at ``rel`` linked into the new tree as it is?  Not: the re-encoded
    arrays (``skip``), what is written anew (commit records, the schema record, the
    root's ``zarr.json``), locks, temp files and dead staging trees."""
    parts = rel.split("/")
    name = parts[-1]
    if rel.startswith(skip) or name.startswith(LOCK_NAME) or is_temp_name(name):
        return False
    if rel in ("zarr.json", f"{META}/{SCHEMA_NAME}"):
        return False
    if parts[0] == META and len(parts) > 1 and is_staging_name(parts[1]):
        return False
    if parts[0] == SEGMENTS and len(parts) > 2:
        own = parts[2:]
        if parts[1].startswith(".") or own == [META, COMMIT_NAME]:
            return False
        if own[0] == META and len(own) > 1 and own[1] == "staging":
            return False
    return True


def _build(root: BufferRoot, info: dict, schema, layouts: dict, changed: dict, tmp) -> None:
    src, backend = root.path, tmp.backend
    segs = list(root.segment_dirs())
    skip = tuple(f"{SEGMENTS}/{s.name}/data/{k}/" for s in segs for k in changed)
    copy_files(tmp, ((loc, rel) for rel, loc in root.backend.walk_files(src) if _copied(rel, skip)))
    for seg in segs:
        if not (tmp / SEGMENTS / seg.name / "data").exists():
            continue  # a segment that never made its arrays
        commit = read_commit(seg)
        Segment.create_arrays(tmp / SEGMENTS / seg.name, schema.specs, layouts)
        if commit is None:
            continue
        for key, lay in changed.items():
            _rewrite(seg, tmp / SEGMENTS / seg.name, key, schema.specs[key], lay, commit)
        fresh = dataclasses.replace(commit, contents=new_contents())
        write_commit(tmp / SEGMENTS / seg.name, fresh, durable=True)
    record = {"schema": schema.to_json(), "layout": {k: vars(v) for k, v in layouts.items()}}
    if (src / META / SCHEMA_NAME).is_file():
        (tmp / META).mkdir(parents=True, exist_ok=True)
        backend.publish(tmp / META / SCHEMA_NAME, json.dumps(record).encode(), durable=True)
    doc = json.loads((src / "zarr.json").read_bytes())
    doc["attributes"]["zreplay"] = {**info, "layout": record["layout"]}
    # The root's zarr.json last: whoever sees it sees every other file of the new tree.
    backend.publish(tmp / "zarr.json", json.dumps(doc, indent=2).encode(), durable=True)


def _rewrite(seg, new_seg, key: str, spec, lay: KeyLayout, commit) -> None:
    """Rows ``[low_row, n_rows)`` of ``key`` from segment ``seg`` into ``new_seg``'s
    array (new layout ``lay``), shard by shard."""
    expect = (spec.dtype, spec.row_shape)
    old_ctx = seg.backend.array_context(durable=False)
    new_ctx = new_seg.backend.array_context(durable=True)
    old = ArrayHandle(seg / "data" / key, old_ctx, False, expect)
    new = ArrayHandle(new_seg / "data" / key, new_ctx, True, expect)
    n, low, sr = commit.n_rows, commit.low_row, lay.shard_rows
    src = old.reopen_if_short(n)
    pending = new.start_resize(n)
    if pending is not None:
        new.finish_resize(pending)
    for a in range(low // sr * sr, n, sr):
        z = min(a + sr, n)
        block = np.zeros((z - a, *spec.row_shape), spec.dtype)
        lo = max(a, low)
        if lo < z:
            block[lo - a :] = src[lo:z].read().result()
        new.store[a:z].write(block).result()
