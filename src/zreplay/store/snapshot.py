"""Copy-free snapshots of a segment: hard links to immutable files.

Every data, index and metadata file is replaced atomically when rewritten (a new inode),
never modified in place, so a hard link taken now keeps today's bytes forever while the
live buffer goes on.  Where linking is impossible (another filesystem) files are copied;
in an object store objects are copied server-side.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from ..errors import FormatError
from .commit import COMMIT_NAME, Commit, _is_temp, write_commit
from .location import Location, RemotePath, copy_file, create_exclusive, remove_tree, walk_files
from .lock import LOCK_NAME
from .root import WRITERS, is_buffer


def _skipped(name: str) -> bool:
    """Files a snapshot never takes: the commit (the caller writes the one it means), the
    writer lock and its companions, and temp files of writes in flight."""
    return name == COMMIT_NAME or name.startswith(LOCK_NAME) or _is_temp(name)


def link_tree(src: Location, dst: Location) -> tuple[int, int]:
    """Hard-link (or copy) every file under ``src`` into ``dst``; returns (linked, copied).

    Lock and commit files are skipped: the caller writes the commit it means.
    """
    if isinstance(src, RemotePath) or isinstance(dst, RemotePath):
        return 0, _copy_tree(src, dst)
    linked = copied = 0
    for dirpath, _dirs, files in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            if _skipped(name):
                continue
            s, d = Path(dirpath) / name, dst / rel / name
            if d.exists():
                d.unlink()
            try:
                os.link(s, d)
                linked += 1
            except FileNotFoundError:
                continue  # an evicted shard deleted while we walked
            except OSError:
                try:
                    shutil.copy2(s, d)
                    copied += 1
                except FileNotFoundError:
                    continue
    return linked, copied


def _copy_tree(src: Location, dst: Location) -> int:
    copied = 0
    for rel, s in walk_files(src):
        name = rel.rsplit("/", 1)[-1]
        if _skipped(name):
            continue
        try:
            copy_file(s, dst / rel)
        except FileNotFoundError:
            continue  # an evicted shard deleted while we walked
        copied += 1
    return copied


def _claim_number(dest: Location, writer_id: str, commit: Commit) -> None:
    """The copy keeps its writer number (and so its trajectory-id range): claim it in the
    new buffer too, so a later writer there never gets the same number."""
    if commit.writer_number >= 0:
        (dest / WRITERS).mkdir(exist_ok=True)
        create_exclusive(dest / WRITERS / str(commit.writer_number), writer_id.encode())


def _write_remote_snapshot(
    root: Location, writer_id: str, commit: Commit, dest: Location, durable: bool
) -> None:
    """Object stores have no rename: write the segment, its commit, then the root's
    ``zarr.json`` last, so an interrupted checkpoint is not a buffer at all."""
    if is_buffer(dest):
        remove_tree(dest)
    elif dest.exists() and any(True for _ in walk_files(dest)):
        raise FormatError(
            f"checkpoint path {dest} is not empty and is not a zreplay buffer; refusing to "
            "overwrite it"
        )
    seg_dst = dest / "segments" / writer_id
    _copy_tree(root / "segments" / writer_id, seg_dst)
    write_commit(seg_dst, commit, durable=durable)
    _claim_number(dest, writer_id, commit)
    copy_file(root / "segments" / "zarr.json", dest / "segments" / "zarr.json")
    copy_file(root / "zarr.json", dest / "zarr.json")


def write_snapshot(
    root: Location, writer_id: str, commit: Commit, dest: Location, durable: bool
) -> None:
    """Materialise ``root``'s segment ``writer_id`` at ``commit`` as a new buffer at ``dest``.

    Built beside ``dest`` and renamed into place, so a crash never leaves half a checkpoint
    under the final name.  An existing zreplay buffer (an older checkpoint) at ``dest`` is
    replaced; any other non-empty directory is refused.
    """
    if isinstance(root, RemotePath) or isinstance(dest, RemotePath):
        _write_remote_snapshot(root, writer_id, commit, dest, durable)
        return
    if dest.exists():
        if dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()
        elif not is_buffer(dest):
            raise FormatError(
                f"checkpoint path {dest} exists and is not an empty directory or a zreplay "
                "buffer; refusing to overwrite it"
            )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.partial-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        shutil.copy2(root / "zarr.json", tmp / "zarr.json")
        (tmp / "segments").mkdir()
        shutil.copy2(root / "segments" / "zarr.json", tmp / "segments" / "zarr.json")
        seg_src = root / "segments" / writer_id
        seg_dst = tmp / "segments" / writer_id
        link_tree(seg_src, seg_dst)
        write_commit(seg_dst, commit, durable=durable)
        _claim_number(tmp, writer_id, commit)
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
