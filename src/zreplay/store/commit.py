"""The commit record: the only source of truth for what a segment has made visible.

``commit.json`` is replaced atomically (temp file, fsync, rename, fsync of the directory)
after every data chunk and index entry it covers has been written.  Readers read it first
and clamp every array to it, so a crash at any moment leaves the previous commit intact.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import CorruptBufferError
from .location import Location, RemotePath, location, write_all

COMMIT_NAME = "commit.json"
FORMAT_VERSION = 2


@dataclass
class Commit:
    """What one segment has published.

    Rows ``[low_row, n_rows)``, trajectories ``[low_traj, n_traj)`` and episode pieces
    ``[low_piece, n_pieces)`` are visible; rows
    below ``low_row`` were evicted, and shards wholly below ``reclaimed_below`` may already
    be deleted.  ``sampler`` holds the owning buffer's sampler state at commit time.
    """

    writer_id: str
    gen: int = 0
    n_rows: int = 0
    n_traj: int = 0
    low_row: int = 0
    low_traj: int = 0
    reclaimed_below: int = 0
    next_trajectory_id: int = 0
    n_pieces: int = 0
    low_piece: int = 0
    next_episode: int = 0
    writer_number: int = -1  # -1: not claimed yet (see BufferRoot.writer_number)
    format: int = FORMAT_VERSION
    time: float = 0.0
    sampler: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Commit:
        try:
            d = json.loads(text)
            c = cls(**d)
            _check_types(c)
        except (ValueError, TypeError) as e:  # UnicodeDecodeError is a ValueError
            raise CorruptBufferError(
                f"{where}: commit record is unreadable ({e}); the segment cannot be trusted. "
                "Restore it from a checkpoint, or run zreplay.verify() for details"
            ) from None
        if c.format != FORMAT_VERSION:
            raise CorruptBufferError(
                f"{where}: format version {c.format} is not supported by this zreplay "
                f"(supports {FORMAT_VERSION}); upgrade zreplay"
            )
        if not (
            0 <= c.low_traj <= c.n_traj
            and 0 <= c.low_row <= c.n_rows
            and 0 <= c.low_piece <= c.n_pieces
        ):
            raise CorruptBufferError(f"{where}: commit record is inconsistent: {d}")
        return c


_TYPES = {"int": int, "float": (int, float), "str": str, "dict": dict}


def _check_types(c: Commit) -> None:
    for name, f in Commit.__dataclass_fields__.items():
        want, v = _TYPES.get(str(f.type)), getattr(c, name)
        if want is not None and (not isinstance(v, want) or isinstance(v, bool)):
            raise TypeError(f"field {name!r} is {v!r}, not {f.type}")


def read_commit(segment_dir: Location) -> Commit | None:
    """The segment's last commit, or None if it never committed."""
    path = location(segment_dir) / COMMIT_NAME
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as e:
        raise CorruptBufferError(f"{path}: commit record is not text ({e})") from None
    return Commit.from_json(text, str(path))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_commit(segment_dir: Location, commit: Commit, durable: bool = True) -> None:
    """Atomically publish ``commit`` (temp + fsync + rename [+ directory fsync]; one PUT,
    atomic by itself, in an object store)."""
    segment_dir = location(segment_dir)
    commit.time = time.time()
    if isinstance(segment_dir, RemotePath):
        (segment_dir / COMMIT_NAME).write_bytes(commit.to_json().encode())
        return
    tmp = segment_dir / f"{COMMIT_NAME}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            write_all(fd, commit.to_json().encode())
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, segment_dir / COMMIT_NAME)
    except BaseException as e:
        tmp.unlink(missing_ok=True)  # a full disk must not also collect temp files
        if isinstance(e, OSError) and e.filename is None:  # say which file (os.write won't)
            raise OSError(e.errno, e.strerror, str(segment_dir / COMMIT_NAME)) from e
        raise
    if durable:
        _fsync_dir(segment_dir)


def remove_orphans(root: Location, committed_shards: Mapping[str, int] | None = None) -> list[Path]:
    """Delete temp files a killed writer left behind (zarr ``*.partial``, TensorStore
    ``*.__lock``, commit temps).  Only called by the segment's writer, under its lock.

    ``committed_shards`` maps a data array's chunk directory (``.../data/<key>/c``) to the
    number of leading shards that hold only committed rows: no writer touches those again,
    so they are not searched (opening a large buffer stays fast).
    """
    if isinstance(root, RemotePath):
        return []  # object stores publish whole objects: no temp files are ever left
    skip = {os.path.normpath(k): v for k, v in (committed_shards or {}).items()}
    removed = []
    for dirpath, dirnames, filenames in os.walk(root):
        limit = skip.get(os.path.normpath(dirpath))
        if limit is not None:
            dirnames[:] = [d for d in dirnames if not d.isdigit() or int(d) >= limit]
        for name in filenames:
            if _is_temp(name):
                p = Path(dirpath) / name
                try:
                    p.unlink()
                    removed.append(p)
                except FileNotFoundError:
                    pass
    return removed


def _is_temp(name: str) -> bool:
    # *.tmp: commit and exclusive-create temps (location.create_exclusive).
    return name.endswith((".partial", ".__lock", ".tmp"))
