"""The ``zreplay`` command line: ``demo``, ``info``, ``verify``, ``upgrade``, ``export``,
``import``, ``plot``.

Each command is a function ``run(args) -> (exit status, JSON object, text)`` in its own
module; :func:`main` parses, runs, prints the text (or, with ``--json``, one JSON object
for scripts) and turns every expected failure into one line on stderr
(:func:`.output.fail`); ``demo`` runs under the same handler.

Every command but ``demo`` takes ``--json`` and ``--quiet`` (no progress bars; bars are
also off when stderr is not a terminal).  Exit status: 0 on success; 1 when a command
fails (``zreplay <command>: error: <message>``: a missing path, a directory that is not a
buffer, a damaged buffer) or ``verify`` found problems; 2 for usage errors (argparse's,
and no command at all: the help goes to stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .output import EXIT_OK, EXIT_USAGE, EXPECTED, fail, interrupted, positive_int


def _parser() -> argparse.ArgumentParser:
    from .. import __version__
    from . import convert, info, plot, upgrade, verify

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object (for scripts)")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress bars")

    ap = argparse.ArgumentParser(
        prog="zreplay",
        description="Inspect, check, convert and plot zreplay buffers.",
        epilog="Exit status: 0 ok, 1 failed (or verify found problems), 2 usage error.",
    )
    ap.add_argument("--version", action="version", version=f"zreplay {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    # Listed for --help only: main() hands `demo ...` to zreplay.demo before parsing.
    sub.add_parser(
        "demo", add_help=False, help="fill, sample, close, reopen and sample a buffer on disk"
    )

    p = sub.add_parser("info", parents=[common], help="schema, counts, sizes, last commit")
    p.add_argument("path", help="buffer directory or zreplay HDF5 file")
    p.set_defaults(run=info.run)

    p = sub.add_parser("verify", parents=[common], help="check commit records, index, checksums")
    p.add_argument("path", help="buffer directory")
    p.add_argument("--index-only", action="store_true", help="skip decoding the data chunks")
    p.set_defaults(run=verify.run)

    p = sub.add_parser(
        "upgrade", parents=[common], help="rewrite a buffer of an older format (2-4) as format 5"
    )
    p.add_argument("path", help="buffer directory")
    p.add_argument(
        "--codec",
        action="append",
        metavar="KEY=CODEC[:LEVEL]",
        help="re-encode KEY with CODEC (png, webp, jpegxl, qoi, jpeg, avif, webp-lossy, "
        "jpegxl-lossy, zstd, lz4, none), all or nothing; repeatable",
    )
    p.set_defaults(run=upgrade.run)

    p = sub.add_parser(
        "export", parents=[common], help="write RLinf .pt/.pkl files, HDF5 or a LeRobot dataset"
    )
    p.add_argument("path", help="buffer directory")
    p.add_argument("out", help="output directory (pt, pkl, lerobot) or file (hdf5)")
    p.add_argument("--format", choices=("pt", "pkl", "hdf5", "lerobot"), required=True)
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export at OUT")
    p.add_argument("--fps", type=positive_int, default=30, help="lerobot: frames per second")
    p.add_argument(
        "--images",
        choices=("video", "image"),
        default="video",
        help="lerobot: uint8 [H, W, 3] keys as AV1 video (lossy) or PNG images (lossless)",
    )
    p.add_argument(
        "--task",
        default=None,
        help="lerobot: the task string of every episode (default: the tasks an earlier "
        "import stored, else empty)",
    )
    p.set_defaults(run=convert.run_export)

    p = sub.add_parser(
        "import", parents=[common], help="read RLinf files, HDF5 or a LeRobot dataset into a buffer"
    )
    p.add_argument(
        "src", help="RLinf buffer directory, zreplay HDF5 file or LeRobot dataset (v3.0, v2.1)"
    )
    p.add_argument("dst", help="new buffer directory")
    p.add_argument(
        "--allow-pickle", action="store_true", help="load RLinf .pkl files (trusted sources only)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace a zreplay buffer at DST")
    p.set_defaults(run=convert.run_import)

    p = sub.add_parser("plot", parents=[common], help="episode returns, lengths, frames (PNG)")
    p.add_argument("path", help="buffer directory")
    p.add_argument("--out", help="image file to write (default: <buffer name>.png here)")
    p.add_argument("--dpi", type=positive_int, default=100)
    p.set_defaults(run=plot.run)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "demo":  # the README's demo parses its own options
        try:
            from .demo import main as demo

            return demo(argv[1:])  # argparse exits 2 on a usage error
        except EXPECTED as e:
            return fail("demo", e, as_json=False)
        except KeyboardInterrupt:
            return interrupted()
    try:
        parser = _parser()  # imports what the commands need (seconds, with torch)
    except KeyboardInterrupt:
        return interrupted()
    if not argv:  # a command is required: the help, as a usage error
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)  # exits 2 on a usage error

    try:
        status, result, text = args.run(args)
    except EXPECTED as e:
        return fail(args.command, e, as_json=args.json)
    except KeyboardInterrupt:
        return interrupted()
    try:
        print(json.dumps({"ok": status == EXIT_OK, **result}) if args.json else text)
        sys.stdout.flush()
    except BrokenPipeError:  # `zreplay info ... | head`: the reader left, not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return status
