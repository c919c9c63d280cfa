"""``zreplay upgrade``: rewrite a buffer of an older format (2, 3 or 4) as format 5.

This is the one module that reads the older formats; everything else refuses them with
:func:`~zreplay.store.format.old_format_error`, which says to run it.  What each changed
(FORMAT.md, "Format versions"): format 2 kept zreplay's own files beside the arrays
(``segments/<w>/commit.json``, ``segments/<w>/writer.lock``, ``<root>/writers/<n>``);
format 3's commit records lack ``contents`` and ``inserted``; format 4 nests every data
array's shard files (``c/<shard>/0/...``), which each array's ``zarr.json`` says and
format 5 reads as it is, so upgraded arrays keep them.  Writers of earlier zreplay
versions set a root to format 5 when they opened it and moved only their own segment:
such a root may still hold segments of an older format, and those are upgraded too.

The upgraded buffer is built as a new tree (every data and index file hard-linked, or
copied server-side in an object store; commit records, claims and the root's metadata
written anew, the root's ``zarr.json`` last) and put in place in one step by the
backend (:meth:`~zreplay.store.backend.Backend.staged_tree`, as a checkpoint saved over
a buffer is), the writer lock of every segment held meanwhile.  An exception or a crash
at any point leaves the old buffer, still upgradable, or the new one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from ..errors import CorruptBufferError, FormatError, WriterLockedError
from .commit import Commit, new_contents, write_commit
from .format import (
    COMMIT_NAME,
    FORMAT_VERSION,
    LIVE_ROWS_ATTR,
    LOCK_NAME,
    META,
    SEGMENTS,
    UPGRADABLE_FORMATS,
    WRITERS,
    commit_path,
    intent_path,
    is_temp_name,
    meta_node_json,
    old_format_error,
)
from .guard import copy_files, new_tree
from .location import Location
from .lock import WriterLock
from .objectswap import is_staging_name
from .root import BufferRoot, group_json


def upgrade(path: str | Path | Location, storage_options: Mapping | None = None) -> int | None:
    """Rewrite the buffer at ``path`` (a directory or an ``s3://`` URL) in the current
    format, all or nothing; returns the format it had (2, 3 or 4: the oldest part of it),
    or None when it is current already (then nothing is touched).

    Refused, with nothing touched: a path that is no zreplay buffer or of a format this
    version cannot upgrade (FormatError), a buffer with a live writer (WriterLockedError;
    close it first), damaged commit records and links or other non-files inside the
    buffer (CorruptBufferError), and a segment whose
    ``load_checkpoint`` was interrupted (FormatError: its writer finishes it first).
    Rows, trajectories, episodes, writer numbers and every facade's and sampler's saved
    state are kept; a format-3 segment gets a contents id and counts its rows as inserts.
    """
    root = BufferRoot(path, storage_options)
    root.recover()  # a replacement a crash interrupted: finished (or undone) first
    info = root.stored_meta()  # FormatError for anything but a zreplay buffer
    version = _outdated(root, info)
    if version is None:
        return None
    for seg in root.segment_dirs():
        _check_no_old_writer(root, seg)
    # Every file is linked or copied as it is: a link (to a file outside the buffer) or a
    # FIFO anywhere in it is refused first (the buffer is untrusted data).
    root.backend.check_files(root.path)
    locked = False
    try:
        with new_tree(root.path, "zreplay upgrade") as tmp:
            locked = True
            # Another upgrade, or a writer that made the buffer anew, may have come between
            # the checks above and the locks now held: what is rewritten is read under them.
            info = root.stored_meta()
            version = _outdated(root, info)
            if version is None:
                raise _NothingToDo
            for seg in root.segment_dirs():
                _check_no_old_writer(root, seg)
            _build(root, info, tmp)
    except _NothingToDo:
        return None  # the staged tree was discarded; the buffer is as it was
    except WriterLockedError:
        if locked:  # an older zreplay's writer, found under the locks: its own message
            raise
        raise _held(root) from None
    return version


def _held(root: BufferRoot) -> WriterLockedError:
    """The segment locks an upgrade takes are held: by a writer, or by another upgrade of
    the same buffer (two ``zreplay upgrade`` runs at once), which holds them all."""
    who = "another process"  # (if it let go meanwhile)
    for seg in root.segment_dirs():
        info = WriterLock(seg).live_holder()
        if info is not None:
            who = f"pid {info.get('pid')} on host {info.get('host')!r} (segment {seg.name!r})"
            break
    return WriterLockedError(
        f"zreplay upgrade: {root.path} is held by {who}: another `zreplay upgrade` of it, "
        "or a writer. Nothing was changed. Wait until that upgrade is done (or close that "
        "writer) and run the upgrade again: that is safe, and does nothing once the "
        "buffer is current"
    )


class _NothingToDo(Exception):
    """Raised inside the staged rewrite to discard it: the buffer became current."""


def _outdated(root: BufferRoot, info: dict) -> int | None:
    """The oldest format found in the root, its writer claims and its segments' commit
    records, or None if every part is current."""
    found = info.get("format")
    if found == FORMAT_VERSION:
        found = None
    elif found not in UPGRADABLE_FORMATS:
        raise old_format_error(root.path, found)
    versions = [] if found is None else [found]
    if (root.path / WRITERS).is_dir():
        versions.append(2)  # format 2's claims, beside the arrays
    for seg in root.segment_dirs():
        record = _old_commit(root, seg)
        if record is not None and record[2] != FORMAT_VERSION:
            versions.append(record[2])
    return min(versions, default=None)


def _old_commit(root: BufferRoot, seg: Location) -> tuple[Location, dict, int] | None:
    """``(file, record, format)`` of segment ``seg``'s commit record, wherever its format
    keeps it (format 2: beside the arrays), or None if it never committed."""
    for path, implied in ((commit_path(seg), FORMAT_VERSION), (seg / COMMIT_NAME, 2)):
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            continue
        try:
            record = json.loads(text)
        except ValueError as e:  # UnicodeDecodeError is a ValueError
            record, why = None, str(e)
        else:
            why = "not a JSON object"
        if not isinstance(record, dict):
            raise CorruptBufferError(
                f"{path}: commit record is unreadable ({why}); the segment cannot be trusted",
                "Restore the buffer from a checkpoint; nothing was upgraded",
            )
        version = record.get("format", implied)
        if version != FORMAT_VERSION and version not in UPGRADABLE_FORMATS:
            raise old_format_error(root.path, version, path)
        return path, record, version
    return None


def _check_no_old_writer(root: BufferRoot, seg: Location) -> None:
    """WriterLockedError if a writer of an older zreplay may hold segment ``seg`` (format
    2 kept its lock beside the arrays; the current place is checked by ``new_tree``),
    FormatError if a load into it was interrupted (its own writer finishes that)."""
    holder = WriterLock(seg).live_holder(seg / LOCK_NAME)
    if holder is not None:
        raise WriterLockedError(
            f"zreplay upgrade: segment {seg.name!r} of {root.path} is being written by pid "
            f"{holder.get('pid')} on host {holder.get('host')!r} (an older zreplay); close "
            "that writer first"
        )
    if intent_path(seg).is_file():
        raise FormatError(
            f"zreplay upgrade: a load_checkpoint into segment {seg.name!r} of {root.path} "
            "was interrupted; open that segment's writer once with the zreplay version "
            "that wrote the buffer (it finishes the load), then upgrade again"
        )


def _target(rel: str) -> str | None:
    """Where the file at ``rel`` (relative to the old root) goes in the new tree, or None
    for what the upgrade writes anew or leaves behind: commit records, the root's
    ``zarr.json``, locks, temp files, and the staged trees of replacements that died."""
    parts = rel.split("/")
    name = parts[-1]
    if name.startswith(LOCK_NAME) or is_temp_name(name) or rel == "zarr.json":
        return None
    if parts[0] == WRITERS:  # format 2's writer claims
        return "/".join([META, *parts])
    if parts[0] == META and len(parts) > 1:
        return None if is_staging_name(parts[1]) else rel  # an object store's dead build
    if parts[0] == SEGMENTS and len(parts) > 2:
        own = parts[2:]
        if parts[1].startswith(".") or own in ([COMMIT_NAME], [META, COMMIT_NAME]):
            return None  # a local replace's staging tree; the commit (written anew)
        if own[0] == META and len(own) > 1 and own[1] == "staging":
            return None  # a load's build that died before its swap
    return rel


def _build(root: BufferRoot, info: dict, tmp: Location) -> None:
    """Make ``tmp`` the format-5 tree of ``root`` (see the module docstring)."""
    src, backend = root.path, tmp.backend
    placed: set[str] = set()
    # Claims in their format-5 place first: one also in format 2's place is the same claim.
    files = sorted(root.backend.walk_files(src), key=lambda f: f[0].startswith(WRITERS + "/"))

    def kept():
        for rel, loc in files:
            to = _target(rel)
            if to is not None and to not in placed:
                placed.add(to)
                yield loc, to

    copy_files(tmp, kept())
    for seg in root.segment_dirs():
        record = _old_commit(root, seg)
        seg_rel = f"{SEGMENTS}/{seg.name}"
        if record is None and not any(p.startswith(seg_rel + "/") for p in placed):
            continue
        _meta_node(tmp / SEGMENTS / seg.name, placed, f"{seg_rel}/{META}/zarr.json")
        if record is not None:
            commit = _current(root, seg, *record[:2])
            _fit_lengths(src, tmp, seg_rel, commit, placed)
            write_commit(tmp / SEGMENTS / seg.name, commit, durable=True)
    _meta_node(tmp, placed, f"{META}/zarr.json")
    if f"{SEGMENTS}/zarr.json" not in placed:
        (tmp / SEGMENTS).mkdir(parents=True, exist_ok=True)
        backend.create_exclusive(tmp / SEGMENTS / "zarr.json", group_json({}))
    doc = json.loads((src / "zarr.json").read_text())
    doc["attributes"]["zreplay"] = {**info, "format": FORMAT_VERSION}
    # The root's zarr.json last: whoever sees it sees every other file of the new tree.
    backend.publish(tmp / "zarr.json", json.dumps(doc, indent=2).encode(), durable=True)


def _fit_lengths(src: Location, tmp: Location, seg_rel: str, commit: Commit, placed) -> None:
    """Make segment ``seg_rel``'s data arrays in the new tree exactly as long as its
    ``commit``'s rows and its ``live_rows`` attribute name them (what plain Zarr shows;
    writers before format 4 left arrays longer).  Metadata only, each file replaced, not
    changed in place (it is a hard link to the old tree's); one that is not what a
    writer wrote is left as it is, for ``zreplay.verify`` to report."""
    rows = [commit.low_row, commit.n_rows]
    for rel in sorted(placed):
        if not rel.startswith(f"{seg_rel}/") or not rel.endswith("/zarr.json"):
            continue
        try:
            doc = json.loads((src / rel).read_bytes())
            if rel == f"{seg_rel}/zarr.json":
                if doc["attributes"].get(LIVE_ROWS_ATTR) == rows:
                    continue
                doc["attributes"][LIVE_ROWS_ATTR] = rows
            elif rel.startswith(f"{seg_rel}/data/") and doc["node_type"] == "array":
                if doc["shape"][0] == commit.n_rows:
                    continue
                doc["shape"][0] = commit.n_rows
            else:
                continue
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            continue
        tmp.backend.publish(tmp / rel, json.dumps(doc, indent=2).encode(), durable=True)


def _meta_node(parent: Location, placed: set[str], rel: str) -> None:
    """The ``zreplay`` meta node under ``parent`` in the new tree (format 2 had none)."""
    if rel not in placed:
        (parent / META).mkdir(parents=True, exist_ok=True)
        parent.backend.create_exclusive(parent / META / "zarr.json", meta_node_json())


def _current(root: BufferRoot, seg: Location, path: Location, record: dict) -> Commit:
    """Segment ``seg``'s commit ``record`` (read from ``path``) as a format-5 commit,
    checked as every commit record is."""
    record = {**record, "format": FORMAT_VERSION}
    record.setdefault("inserted", record.get("n_rows", 0))  # format 3: every row an add
    if not record.get("contents"):  # format 3: a contents id of its own from now on
        record["contents"] = new_contents()
    commit = Commit.from_json(json.dumps(record), str(path), root.path)
    if commit.writer_id != seg.name:
        raise CorruptBufferError(
            f"{path}: the commit record is segment {commit.writer_id!r}'s, not "
            f"{seg.name!r}'s (a file copied between segments?); restore the buffer from "
            "a checkpoint; nothing was upgraded"
        )
    return commit
