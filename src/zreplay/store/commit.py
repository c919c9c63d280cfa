"""The commit record: the only source of truth for what a segment has made visible.

``commit.json`` is published atomically (the backend's ``publish``: temp file, fsync,
rename, fsync of the directory locally; one PUT in S3) after every data chunk and index
entry it covers has been written.  Readers read it first
and clamp every array to it, so a crash at any moment leaves the previous commit intact.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import CorruptBufferError
from .format import (
    COMMIT_NAME,
    FORMAT_VERSION,
    ID_BITS,
    UPGRADABLE_FORMATS,
    commit_path,
    old_format_error,
)
from .location import Location, locate

log = logging.getLogger("zreplay")


@dataclass
class Commit:
    """What one segment has published.

    Rows ``[low_row, n_rows)``, trajectories ``[low_traj, n_traj)`` and episode pieces
    ``[low_piece, n_pieces)`` are visible; rows
    below ``low_row`` were evicted, and shards wholly below ``reclaimed_below`` may already
    be deleted.  ``sampler`` holds the owning buffer's sampler state at commit time.
    ``contents`` names the segment's contents: a new random id whenever they are replaced
    wholesale (the first commit, a clear, a loaded checkpoint), so a reader that sees it
    change knows its cached rows are not these rows, whatever their numbers and ids.
    ``inserted`` counts rows ever added to the segment by adds (not rows a clear skipped
    or a loaded checkpoint brought): what rate limiting calls inserts.
    ``sealed``: the segment is an immutable offline part (an import, or ``zreplay.seal``):
    no writer opens it again, and writers of the other segments sample it beside their
    own rows; recorded only when true (FORMAT.md "Sealed segments").
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
    contents: str = ""  # "": not committed yet
    inserted: int = 0
    format: int = FORMAT_VERSION
    time: float = 0.0
    sampler: dict = field(default_factory=dict)
    sealed: bool = False

    def to_json(self) -> str:
        d = asdict(self)
        if not self.sealed:  # an unsealed record stays what zreplay always wrote
            del d["sealed"]
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, where: str, buffer=None) -> Commit:
        """The record ``text`` read from ``where`` (a commit of a segment of the buffer
        at ``buffer``, named in the error of an older format's record)."""
        try:
            d = json.loads(text)
            version = d.get("format", FORMAT_VERSION) if isinstance(d, dict) else FORMAT_VERSION
            if version == FORMAT_VERSION:  # an older record lacks fields: not defaulted
                c = cls(**d)
                _check_types(c)
        except (ValueError, TypeError) as e:  # UnicodeDecodeError is a ValueError
            raise CorruptBufferError(
                f"{where}: commit record is unreadable ({e}); the segment cannot be trusted",
                "Restore it from a checkpoint, or run zreplay.verify() for details",
            ) from None
        if version in UPGRADABLE_FORMATS:
            raise old_format_error(buffer or where, version, where)
        if version != FORMAT_VERSION:
            raise CorruptBufferError(
                f"{where}: format version {str(version)[:20]} is not supported by this "
                f"zreplay (reads {FORMAT_VERSION}); upgrade zreplay"
            )
        if not (
            0 <= c.low_traj <= c.n_traj
            and 0 <= c.low_row <= c.n_rows
            and 0 <= c.low_piece <= c.n_pieces
            # shards are reclaimed below the first visible row only (a clear: at it)
            and 0 <= c.reclaimed_below <= c.low_row
            and c.inserted >= 0
            and c.next_trajectory_id >= 0
            and c.next_episode >= 0
        ):
            raise CorruptBufferError(
                f"{where}: commit record is inconsistent: {d}; the segment cannot be trusted",
                "Restore it from a checkpoint; zreplay.verify() reports all damage",
            )
        wild = _out_of_range(c)
        if wild:
            raise CorruptBufferError(
                f"{where}: commit record holds numbers out of range ({', '.join(wild)}); "
                "no writer records these: the segment cannot be trusted (restore it from "
                "a checkpoint; zreplay.verify() reports all damage)"
            )
        return c


# Every count of a commit record is stored in int64 columns and arrays (offsets, ids,
# episode numbers): a larger number in a crafted record would overflow them later.
INT64_MAX = (1 << 63) - 1
_COUNTS = (
    "gen", "n_rows", "n_traj", "low_row", "low_traj", "reclaimed_below",
    "n_pieces", "low_piece", "inserted",
)  # fmt: skip


def _out_of_range(c: Commit) -> list[str]:
    """``field=value`` of each number of ``c`` outside what its columns can hold."""
    bounds = {f: (0, INT64_MAX) for f in _COUNTS}
    # Ids and episodes handed out next: one past the largest int64 once all are used.
    bounds["next_trajectory_id"] = bounds["next_episode"] = (0, INT64_MAX + 1)
    # Writer n's trajectory ids start at n << ID_BITS, an int64.
    bounds["writer_number"] = (-1, (1 << (63 - ID_BITS)) - 1)
    return [
        f"{f}={getattr(c, f)}" for f, (lo, hi) in bounds.items() if not lo <= getattr(c, f) <= hi
    ]


_TYPES = {"int": int, "float": (int, float), "str": str, "dict": dict}


def _check_types(c: Commit) -> None:
    if not isinstance(c.sealed, bool):
        raise TypeError(f"field 'sealed' is {c.sealed!r}, not a bool")
    for name, f in Commit.__dataclass_fields__.items():
        want, v = _TYPES.get(str(f.type)), getattr(c, name)
        if want is not None and (not isinstance(v, want) or isinstance(v, bool)):
            raise TypeError(f"field {name!r} is {v!r}, not {f.type}")


VIEW_ROWS = "view_rows"  # Commit.sampler key: see view_low_traj
MAX_VIEW_ROWS = 2**62  # more than any segment holds (row numbers are int64)


def view_rows_problem(commit: Commit) -> str | None:
    """What is wrong with ``commit``'s ``sampler["view_rows"]`` (absent is fine), or None."""
    n = (commit.sampler or {}).get(VIEW_ROWS)
    if n is None:
        return None
    if type(n) is not int or not 1 <= n <= MAX_VIEW_ROWS:
        return f"sampler.{VIEW_ROWS} is {str(n)[:40]!r}, not an int in [1, 2**62]"
    return None


def view_low_traj(commit: Commit, offsets, where: str) -> int:
    """The first trajectory a view shows of a segment at ``commit`` (``offsets``: its
    trajectory offsets ``[n_traj + 1]``; ``where``: the segment, for the error).  A writer that keeps rows readers must not see
    below its newest ones (ZarrStorage: rows its ring has overwritten stay on disk until
    their whole trajectory is) records ``sampler["view_rows"] = k``: views show only the
    trajectories that start within the newest ``k`` rows, never fewer than the newest
    one.  Absent: every visible trajectory, from ``low_traj``.  A value that is not a
    positive int is a CorruptBufferError (checked before any row is shown)."""
    why = view_rows_problem(commit)
    if why:
        raise CorruptBufferError(
            f"{where}: commit record is damaged or crafted: {why}; restore the "
            "segment from a checkpoint, or run zreplay.verify() for details"
        )
    k = (commit.sampler or {}).get(VIEW_ROWS)
    if k is None or commit.n_traj <= commit.low_traj or commit.n_rows - k <= commit.low_row:
        return commit.low_traj
    first = int(np.searchsorted(offsets[: commit.n_traj + 1], commit.n_rows - k, side="left"))
    return min(max(first, commit.low_traj), commit.n_traj - 1)


def new_contents() -> str:
    """A fresh ``Commit.contents`` id."""
    return uuid.uuid4().hex


def same_contents(old: Commit, new: Commit) -> bool | None:
    """Whether ``new`` shows the rows ``old`` showed and maybe more (True), other rows
    (False: the segment was cleared or replaced since), or None when a commit written
    before contents ids cannot tell (callers then compare trajectory ids)."""
    if not old.contents or not new.contents:
        return None
    return old.contents == new.contents and new.n_rows >= old.n_rows


def read_commit(segment_dir: Location) -> Commit | None:
    """The segment's last commit, or None if it never committed.  A record of an older
    format (or one where format 2 kept it, beside the arrays) is a FormatError saying to
    run ``zreplay upgrade``."""
    segment_dir = locate(segment_dir)
    buffer = segment_dir.parent.parent
    path = commit_path(segment_dir)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        if (segment_dir / COMMIT_NAME).is_file():  # format 2's place (see store/upgrade.py)
            raise old_format_error(buffer, 2, segment_dir / COMMIT_NAME) from None
        return None
    c = Commit.from_json(text, str(path), buffer)
    if c.writer_id != segment_dir.name:
        raise CorruptBufferError(
            f"{path}: the commit record is segment {c.writer_id!r}'s, not "
            f"{segment_dir.name!r}'s (a file copied between segments?); restore the "
            "segment from a checkpoint"
        )
    return c


def commit_stamp(segment_dir: Location) -> object:
    """What changes whenever the segment publishes a commit, read far more cheaply than
    the commit itself: locally the record's inode, modification time and size (every
    publish renames a new file into place), elsewhere its bytes; None before the first
    commit.  For a reader asking "is my snapshot still the newest?" on every item."""
    path = commit_path(locate(segment_dir))
    if path.backend.is_local:
        return path.backend.file_stamps([path])[0]  # None: no such file
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def write_commit(segment_dir: Location, commit: Commit, durable: bool = True) -> None:
    """Atomically publish ``commit`` as the segment's commit record (stamping its time)."""
    segment_dir = locate(segment_dir)
    commit.time = time.time()
    commit.format = FORMAT_VERSION
    path = commit_path(segment_dir)
    data = commit.to_json().encode()
    try:
        path.backend.publish(path, data, durable)
    except OSError as e:
        # The record may be in place already (only the directory's fsync failed): then
        # it is published, and reporting a failure would have the writer redo a commit
        # readers see (and rewrite the priority copy it names).
        try:
            visible = path.read_bytes() == data
        except OSError:
            visible = False
        if not visible:
            raise
        log.warning("zreplay: %s is published but may not be durable yet: %r", path, e)


def remove_orphans(root: Location, committed_shards: Mapping[str, int] | None = None) -> list:
    """Delete temp files a killed writer left behind (zarr ``*.partial``, TensorStore
    ``*.__lock``, commit temps).  Only called by the segment's writer, under its lock.

    ``committed_shards`` maps a data array's chunk directory (``.../data/<key>/c``) to the
    number of leading shards that hold only committed rows: no writer touches those again,
    so they are not searched (opening a large buffer stays fast).
    """
    root = locate(root)
    return root.backend.remove_temps(root, committed_shards)
