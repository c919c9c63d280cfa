"""``zreplay.verify(path)``: walk a buffer and report every problem found.

Checks, per segment: the commit record parses and is consistent (a ZarrStorage's record
in it too, and the ``view_rows`` it may hold), every array's ``zarr.json`` says what the
root records (dtype, row shape, layout, crc32c checksums), the array shapes and shard files cover the commit's counts, the index (offsets,
trajectory and episode columns) agrees with it, and (with ``data=True``) every committed
row of every key decodes with a valid checksum (a segment whose codec this Python lacks is
listed as not checked, not as damaged).  Reads only; takes no lock, so it can run beside a
live writer (rows committed after it read a segment's commit are not checked).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import CorruptBufferError, FormatError, MissingCodecError
from .arraymeta import check_array, segment_arrays
from .commit import read_commit, view_rows_problem
from .format import PRIORITY_SLOTS, commit_path, is_temp_name
from .layout import shard_number
from .priority import PriorityArrays, priority_record
from .root import BufferRoot
from .segment import Segment
from .torchrl_record import KIND, record_problem


@dataclass
class VerifyReport:
    """What :func:`verify` found. ``ok`` is True when ``problems`` and ``unchecked`` are
    empty; ``rows_checked`` counts rows (every key of each was decoded), not rows x keys;
    ``unchecked``: what could not be checked here and why (a codec this Python lacks:
    no damage was found, none is ruled out)."""

    path: str
    segments: int = 0
    trajectories: int = 0
    rows_checked: int = 0
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unchecked

    def __str__(self) -> str:
        state = f"{len(self.problems)} problem(s)" if self.problems else "not all checked"
        head = (
            f"{self.path}: {'OK' if self.ok else state}; "
            f"{self.segments} segment(s), {self.trajectories} trajectories, "
            f"{self.rows_checked} rows checked"
        )
        lines = [head] + [f"  problem: {p}" for p in self.problems]
        lines += [f"  cannot check: {u}" for u in self.unchecked]
        return "\n".join(lines + [f"  warning: {w}" for w in self.warnings])


def verify(
    path: str | Path,
    *,
    data: bool = True,
    progress: Callable[[str, str, int], None] | None = None,
    storage_options: dict | None = None,
) -> VerifyReport:
    """Check a buffer directory; returns a :class:`VerifyReport` (never raises for damage
    it can describe).  ``progress(writer_id, key, rows)`` is called after each shard's
    rows of a key were checked (for progress bars)."""
    try:
        root = BufferRoot(path, storage_options)
    except CorruptBufferError as e:  # a link where the root keeps its own files
        report = VerifyReport(str(path))
        report.problems.append(str(e))
        return report
    report = VerifyReport(str(root.path))
    try:
        root.recover()  # a checkpoint replaced over it and interrupted: finish it first
        root.read_meta()
        schema, layouts = root.schema()
    except (FormatError, CorruptBufferError, ValueError, KeyError) as e:
        report.problems.append(f"root metadata: {e}")
        return report
    missing = root.unfinished()
    if missing:
        report.problems.append(
            f"the buffer's creation was interrupted ({', '.join(map(str, missing))} missing): "
            "plain Zarr cannot open it and checkpoints fail; open any writer on this path "
            "(a TrajectoryReplayBuffer, ReplayBuffer or ZarrStorage) to finish it"
        )
    try:
        seg_dirs = [root.segment_dir(wid) for wid in root.writer_ids()]
    except CorruptBufferError as e:  # a link out of the buffer, a name no writer made
        report.problems.append(str(e))
        return report
    for seg_dir in seg_dirs:
        wid = seg_dir.name
        report.segments += 1
        temps = [
            rel
            for rel, _ in root.backend.walk_files(seg_dir)
            if is_temp_name(rel.rsplit("/", 1)[-1])
        ]
        if temps:
            report.warnings.append(
                f"segment {wid!r}: {len(temps)} temp file(s) of an interrupted write "
                "(removed when its writer next opens it)"
            )
        try:
            root.backend.check_files(seg_dir)  # a FIFO would block the reads below
            commit = read_commit(seg_dir)
        except CorruptBufferError as e:
            report.problems.append(e.finding)
            continue
        except FormatError as e:  # a segment of an older format: zreplay upgrade
            report.problems.append(str(e))
            continue
        if commit is None:
            if any(True for _ in root.backend.walk_files(seg_dir / "data")):
                report.warnings.append(
                    f"segment {wid!r} has stored rows but no commit record: none of them is "
                    "visible (a writer that died before its first commit, or a deleted "
                    "commit.json)"
                )
            continue
        facade = (commit.sampler or {}).get("facade") or {}
        if isinstance(facade, dict) and facade.get("kind") == KIND:
            why = record_problem(facade, commit.n_rows, None if schema is None else schema.keys)
            if why:
                report.problems.append(f"{commit_path(seg_dir)}: sampler.facade: {why}")
        why = view_rows_problem(commit)
        if why:
            report.problems.append(f"{commit_path(seg_dir)}: {why}")
        if commit.n_traj == 0:
            continue
        if schema is None:
            report.problems.append(f"segment {wid!r} has committed rows but the root has no schema")
            continue
        meta_problems, unchecked = [], []
        for rel, dtype, row, lay in segment_arrays(schema, layouts):
            bad, warn = check_array(seg_dir / rel, dtype, row, lay)
            meta_problems += bad
            unchecked += [rel] if warn else []
        if unchecked:
            report.warnings.append(
                f"segment {wid!r}: {len(unchecked)} index arrays ({', '.join(unchecked[:3])}"
                f"{', ...' if len(unchecked) > 3 else ''}) were written without crc32c "
                "checksums (by zreplay before 0.1.0 final): damage to them goes unnoticed"
            )
        if meta_problems:
            report.problems += meta_problems
            continue
        try:
            seg = Segment(seg_dir, schema, layouts, writable=False)
            cols = seg.read_index(commit)
        except CorruptBufferError as e:
            report.problems.append(e.finding)
            continue
        except MissingCodecError as e:
            report.unchecked.append(f"segment {wid!r}: missing codec: {e}")
            continue
        del cols  # read_index checked it against the commit (segment.index_problem)
        report.trajectories += commit.n_traj - commit.low_traj
        if data:
            first = max(commit.low_row, commit.reclaimed_below)
            gone = _moved_on(seg_dir, commit)
            for key, lay in layouts.items():
                if not _enough_shards(seg_dir, key, lay.shard_rows, first, commit, report):
                    continue
                _check_rows(seg, key, lay.shard_rows, first, commit.n_rows, report, progress, gone)
            report.rows_checked += commit.n_rows - first if layouts else 0
            _check_priorities(seg_dir, commit, report)
    return report


def _moved_on(seg_dir, commit) -> Callable[[int], bool]:
    """``gone(row)``: whether a live writer has since published a commit under which
    ``row`` is no longer visible (evicted and reclaimed, cleared, replaced): then what
    failed to read there is no damage."""

    def gone(row: int) -> bool:
        try:
            now = read_commit(seg_dir)
        except CorruptBufferError:
            return False
        if now is None or now.contents != commit.contents:
            return now is None or bool(commit.contents)
        return now.low_row > row or now.reclaimed_below > row

    return gone


def _check_priorities(seg_dir: Path, commit, report: VerifyReport) -> None:
    """The saved priority copy the commit names decodes, and holds valid leaves (a
    problem otherwise); a copy it does not name that does not decode is a warning (its
    contents are garbage by definition, and the writer rewrites it whole)."""
    try:
        meta = priority_record(commit, commit_path(seg_dir))
    except CorruptBufferError as e:
        report.problems.append(str(e))
        return
    arrays = PriorityArrays(seg_dir, writable=False)
    for slot in PRIORITY_SLOTS:
        if meta and slot == int(meta["slot"]):
            continue
        damage = arrays.damage(slot)
        now = _named_priorities(seg_dir) if damage else None
        if damage and now is not None and now.get("seq") == (meta or {}).get("seq"):
            report.warnings.append(
                f"{seg_dir}: the priority copy {slot}, which the commit does not name, is "
                f"damaged ({damage}); harmless: the writer rewrites it whole at its next save"
            )
    if not meta:
        return
    lo, hi = max(meta["low"], commit.low_row), min(meta["high"], commit.n_rows)
    try:
        leaves = arrays.read(meta["slot"], lo, hi)
    except CorruptBufferError as e:
        now = _named_priorities(seg_dir)
        if now is None or now.get("seq") == meta.get("seq"):  # still named: damage
            report.problems.append(e.finding)
        return  # else a live writer saved again, rewriting the copy read
    if leaves.size and not (np.isfinite(leaves).all() and leaves.min() >= 0):
        report.problems.append(f"{seg_dir}: saved priorities hold negative or non-finite leaves")


def _named_priorities(seg_dir) -> dict | None:
    try:
        now = read_commit(seg_dir)
    except CorruptBufferError:
        return None
    return None if now is None else (now.sampler or {}).get("priority") or {}


def _enough_shards(seg_dir, key: str, shard_rows: int, first: int, commit, report) -> bool:
    """False (a problem reported) if the commit counts rows in more shards than the
    array has files: checked before reading (a damaged count could be 10**15 rows)."""
    array = seg_dir / "data" / key
    stored = sum(
        1
        for rel, _ in array.backend.walk_files(array)
        if shard_number(rel) is not None and not is_temp_name(rel)
    )
    need = -(-(commit.n_rows - first) // shard_rows) if commit.n_rows > first else 0
    if need > stored + 1:
        report.problems.append(
            f"{commit_path(seg_dir)}: {commit.n_rows - first} rows of {key!r} need {need} "
            f"shards, but {array} holds {stored}"
        )
        return False
    return True


def _check_rows(
    seg: Segment, key: str, step: int, first: int, stop: int, report, progress=None, gone=None
) -> int:
    start = (first // step) * step
    for a in range(start, stop, step):
        lo, hi = max(a, first), min(a + step, stop)
        try:
            seg.read_range(key, lo, hi).result()
        except MissingCodecError as e:
            report.unchecked.append(f"segment {seg.writer_id!r}, key {key!r}: missing codec: {e}")
            break
        except CorruptBufferError as e:
            if gone is None or not gone(lo):  # evicted since by a live writer: no damage
                report.problems.append(e.finding)
        if progress is not None:
            progress(seg.writer_id, key, hi - lo)
    return stop - first
