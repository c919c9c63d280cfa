"""What a path on the command line is (buffer, HDF5 file, RLinf directory), its size on
disk, and refusing to clobber one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..compat.rlinf_files import is_rlinf_dir
from ..errors import FormatError
from ..store.location import locate

__all__ = ["buffer_dir", "check_output", "du", "existing", "is_hdf5", "is_rlinf_dir"]


def existing(path: str | Path):
    """``path`` as a location (a local path, or an object-store location for
    ``s3://...`` URLs; s3fs reads the endpoint and credentials from the usual AWS
    environment variables), which must exist."""
    p = locate(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    return p


def buffer_dir(path: str | Path):
    """``path`` if it looks like a buffer directory (the rest is checked on opening)."""
    p = existing(path)
    if not p.is_dir():
        raise FormatError(f"{p} is a file, not a zreplay buffer directory")
    if not (p / "zarr.json").is_file():
        raise FormatError(f"{p} is not a zreplay buffer (no zarr.json)")
    return p


def is_hdf5(path) -> bool:
    import h5py

    p = locate(path)
    return p.backend.is_local and p.is_file() and h5py.is_hdf5(p)


def du(path) -> int:
    """Bytes of the files under ``path`` (a file's own size for a file)."""
    p = locate(path)
    return p.backend.du(p)


def writer_locks(path: Path) -> list[Path]:
    """``writer.lock`` files of a buffer's segments (a writer may be running)."""
    segments = path / "segments"
    return sorted([*segments.glob("*/zreplay/writer.lock"), *segments.glob("*/writer.lock")])


def check_output(
    out: Path, overwrite: bool, replaceable: Callable[[Path], bool], what: str
) -> None:
    """Refuse ``out`` unless it is free (absent or an empty directory) or, with
    ``--overwrite``, ``what`` (``replaceable``).  Nothing is removed here: the writers
    build their output aside and swap it in whole, so a failure keeps the old one."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not overwrite:
        raise FileExistsError(f"{out} exists; pick a new path or pass --overwrite")
    if not replaceable(out):
        raise FileExistsError(f"{out} exists and is not {what}; refusing to overwrite it")
