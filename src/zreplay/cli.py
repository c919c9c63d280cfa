"""The ``zreplay`` command line."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"demo": "fill, sample, close, reopen and sample a buffer on disk"}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print("usage: zreplay COMMAND [options]\n\ncommands:")
        for name, text in commands.items():
            print(f"  {name:8s} {text}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    if argv[0] == "demo":
        from .demo import main as demo

        return demo(argv[1:])
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
