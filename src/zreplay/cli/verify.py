"""``zreplay verify PATH``: :func:`zreplay.verify` with a progress bar; exit 1 on problems."""

from __future__ import annotations

from pathlib import Path

from .output import EXIT_FAILED, EXIT_OK, Result, progress
from .paths import buffer_dir


def run(args) -> Result:
    import zreplay

    path = buffer_dir(args.path)
    total, n_keys = (None, 1) if args.index_only else rows_to_check(path)
    with progress(args, total, "verify", "row") as bar:

        def tick(writer_id: str, key: str, rows: int) -> None:
            bar.set_postfix_str(f"{writer_id}/{key}", refresh=False)
            bar.update(rows / n_keys)  # a row is done when all its keys are

        report = zreplay.verify(path, data=not args.index_only, progress=tick)
    result = {
        "path": report.path,
        "ok": report.ok,
        "segments": report.segments,
        "trajectories": report.trajectories,
        "rows_checked": report.rows_checked,
        "problems": report.problems,
        "warnings": report.warnings,
        "unchecked": report.unchecked,
    }
    return (EXIT_OK if report.ok else EXIT_FAILED), result, str(report)


def rows_to_check(path: Path) -> tuple[int | None, int]:
    """``(rows, keys)`` that ``verify`` will decode (the bar's total is the rows); rows
    None when the commit records cannot be read (verify then reports why)."""
    from ..errors import ZReplayError
    from ..store.commit import read_commit
    from ..store.root import BufferRoot

    try:
        root = BufferRoot(path)
        schema, _ = root.schema()
        total = 0
        for wid in root.writer_ids():
            c = read_commit(root.segment_dir(wid))
            if c is not None and c.n_traj:
                total += c.n_rows - max(c.low_row, c.reclaimed_below)
        return total, max(1, len(schema) if schema is not None else 0)
    except (ZReplayError, OSError, ValueError, KeyError):
        return None, 1
