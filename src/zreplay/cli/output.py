"""What the commands print: exit statuses, progress bars, sizes, dates, tables."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..errors import ZReplayError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# What a command may fail with that is the input's fault, not zreplay's: one line and exit
# 1 (OSError and KeyError: also h5py's).  Anything else is a bug and keeps its traceback.
EXPECTED = (ZReplayError, OSError, ValueError, KeyError)

Result = tuple[int, dict[str, Any], str]  # exit status, JSON object, text for a human


def progress(args, total: int | None, desc: str, unit: str):
    """A tqdm bar on stderr, silent under ``--quiet`` or when stderr is not a terminal
    (so scripts and CI logs get no carriage-return noise)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
        disable=args.quiet or not sys.stderr.isatty(),
    )


def size(n: float) -> str:
    """``1234567`` -> ``"1.2 MB"`` (decimal units, like ``du --si``)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def ratio(raw: int, disk: int) -> float | None:
    return round(raw / disk, 2) if disk else None


def when(t: float | None) -> str:
    """A Unix time as local date and time (``"never"`` for None)."""
    if t is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


def table(rows: list[list[str]], right: set[int]) -> list[str]:
    """Rows of cells as aligned lines; columns in ``right`` are right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]


def one_line(e: BaseException) -> str:
    """An exception's message on one line (at most 500 characters)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 500 else text[:497] + "..."


def fail(command: str, e: BaseException, as_json: bool) -> int:
    """Report an expected failure of ``zreplay <command>`` as one line on stderr
    (``zreplay <command>: error: <message>``, argparse's form for usage errors), and as
    ``{"ok": false, "error": ...}`` on stdout under ``--json``; returns exit status 1."""
    message = one_line(e)
    print(f"zreplay {command}: error: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"ok": False, "error": message}))
    return EXIT_FAILED


def interrupted() -> int:
    """Ctrl-C: one line, and the shell's status for SIGINT."""
    print("zreplay: interrupted", file=sys.stderr)
    return 130


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (else a usage error, exit status 2)."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return v
