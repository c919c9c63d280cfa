"""Copy-free snapshots of a segment: hard links to immutable files.

Every data, index and metadata file is replaced atomically when rewritten (a new inode),
never modified in place, so a hard link taken now keeps today's bytes forever while the
live buffer goes on.  Where linking is impossible (another filesystem) files are copied;
in an object store objects are copied server-side (each backend's ``import_file``).
"""

from __future__ import annotations

from .commit import Commit, write_commit
from .format import (
    COMMIT_NAME,
    LOCK_NAME,
    META,
    SEGMENTS,
    claims_dir,
    is_temp_name,
    meta_node_json,
)
from .guard import new_tree
from .location import Location


def _skipped(name: str) -> bool:
    """Files a snapshot never takes: the commit (the caller writes the one it means), the
    writer lock and its companions, and temp files of writes in flight."""
    return name == COMMIT_NAME or name.startswith(LOCK_NAME) or is_temp_name(name)


def link_tree(src: Location, dst: Location) -> tuple[int, int]:
    """Hard-link (or copy) every file under ``src`` into ``dst``; returns (linked, copied).

    Lock and commit files are skipped: the caller writes the commit it means.
    """
    return dst.backend.import_tree(src, dst, _skipped)


def _claim_number(dest: Location, writer_id: str, commit: Commit) -> None:
    """The copy keeps its writer number (and so its trajectory-id range): claim it in the
    new buffer too, so a later writer there never gets the same number."""
    if commit.writer_number >= 0:
        claims = claims_dir(dest)
        claims.mkdir(parents=True, exist_ok=True)
        dest.backend.create_exclusive(claims / str(commit.writer_number), writer_id.encode())


def write_snapshot(
    root: Location, writer_id: str, commit: Commit, dest: Location, durable: bool
) -> None:
    """Materialise ``root``'s segment ``writer_id`` at ``commit`` as a new buffer at ``dest``.

    Built where the backend stages new trees (beside ``dest``, renamed into place; in
    place in an object store, with the root's ``zarr.json`` written last), so a crash
    never leaves half a checkpoint under the final name.  An existing zreplay buffer (an
    older checkpoint) at ``dest`` is replaced, its segments' writer locks held meanwhile;
    the source itself, a path inside or around it, a buffer with a live writer and any
    other non-empty directory are refused before anything is touched (:mod:`.guard`).
    """
    backend = dest.backend
    with new_tree(dest, "save_checkpoint", sources=[root]) as tmp:
        seg_dst = tmp / SEGMENTS / writer_id
        link_tree(root / SEGMENTS / writer_id, seg_dst)
        write_commit(seg_dst, commit, durable=durable)
        (tmp / META).mkdir(parents=True, exist_ok=True)
        backend.create_exclusive(tmp / META / "zarr.json", meta_node_json())
        _claim_number(tmp, writer_id, commit)
        (tmp / SEGMENTS).mkdir(parents=True, exist_ok=True)
        for meta in (f"{SEGMENTS}/zarr.json", "zarr.json"):  # the root's metadata last
            backend.import_file(root / meta, tmp / meta, link=False)
