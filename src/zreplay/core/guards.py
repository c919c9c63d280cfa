"""Mistakes of a first hour with zreplay that the core catches where they happen.

* A script without ``if __name__ == "__main__":`` that hands a buffer to DataLoader
  workers started with ``spawn``/``forkserver``: each worker imports the script again,
  which opens the buffer's writer again; instead of a ``WriterLockedError`` and then
  "DataLoader worker exited unexpectedly", the worker says what happened.
* float64 images (8x the bytes of uint8 frames) fixed by a buffer's first add.
"""

from __future__ import annotations

import multiprocessing

import numpy as np

from ..engine.writer import SegmentWriter
from ..errors import MainGuardError, warn_caller
from ..schema import Schema

MIN_IMAGE_SIDE = 8


def check_not_bootstrapping(path) -> None:
    """``MainGuardError`` in a process multiprocessing is still starting (it sets
    ``_inheriting`` while the child imports the parent's main module; the same flag its
    own "bootstrapping phase" error checks)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        where = "a temporary buffer" if path is None else f"the buffer at {path}"
        raise MainGuardError(
            "this process was started by multiprocessing ('spawn' or 'forkserver', e.g. a "
            "DataLoader worker) and is importing your script again, whose top-level code "
            f"opens {where} for writing a second time. Put the code that creates the "
            'buffer and runs training under `if __name__ == "__main__":` (workers get the '
            "buffer from the DataLoader, already open)"
        )


def looks_like_image(row_shape: tuple[int, ...]) -> bool:
    """``(H, W, C)`` or ``(C, H, W)`` with ``C`` in 1, 3, 4 and sides >= 8."""
    if len(row_shape) != 3:
        return False
    for c, h, w in ((row_shape[2], *row_shape[:2]), row_shape):
        if c in (1, 3, 4) and min(h, w) >= MIN_IMAGE_SIDE:
            return True
    return False


def warn_float_images(schema: Schema | None) -> None:
    """Warn (once per buffer: its first add fixes the schema) about float64 image keys."""
    keys = [
        f"{s.path!r} {s.row_shape}"
        for s in schema or ()
        if s.dtype == np.float64 and looks_like_image(s.row_shape)
    ]
    if keys:
        warn_caller(
            f"zreplay: float64 images ({', '.join(keys)}) take 8x the space of uint8 "
            "frames (and 2x float32). Store pixels as uint8: x.astype(np.uint8) for 0-255 "
            "values, (x * 255).round().astype(np.uint8) for values in [0, 1], or float32 "
            "if they must stay floats. The first add fixed this buffer's dtypes: start "
            "it again (overwrite=True) to change them"
        )


def add_checked(writer, items) -> list[int]:
    """``writer.add(items)``, warning about float64 images if it fixed the schema."""
    first = writer.schema is None
    ids = writer.add(items)
    if first and items:
        warn_float_images(writer.schema)
    return ids


def new_writer(path, options):
    """``SegmentWriter(path, **options)``, refused in a process still bootstrapping."""
    check_not_bootstrapping(path)
    return SegmentWriter(path, **options)
