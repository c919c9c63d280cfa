"""Episodes out of any buffer or view: ``dump(src, path, format="hdf5" | "zarr", mode=...)``.

HDF5: one file (layout in :mod:`zreplay.compat.hdf5`).  Zarr: a zreplay buffer directory
holding one trajectory ``[L, 1]`` per episode, as :class:`~zreplay.ReplayBuffer` writes
them (its random stream and clip sampling resume on it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..core import BufferCore, Prepared, RamPolicy, RandomStream
from ..core.records import BATCH_BYTES
from ..errors import FormatError
from ..store.location import locate
from ..store.root import is_buffer
from .hdf5 import MODES, write_hdf5

# RAM kept decoded while a Zarr dump is written (as ReplayBuffer's default).
DUMP_RAM_BYTES = 1 << 30


def episode_batches(
    core: BufferCore, progress=None, batch_bytes: int = BATCH_BYTES
) -> Iterator[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Every visible episode, oldest first, in batches read together (one range read per
    key where the episodes' rows are contiguous): ``(columns [steps, ...], {"length",
    "terminated", "truncated"})``; ``progress(k)`` after each batch of ``k`` episodes."""
    n, e = core.num_episodes, 0
    while e < n:
        cols, table = core.episodes_from(e, batch_bytes=batch_bytes)
        k = len(table["length"])
        e += k
        if progress is not None:
            progress(k)
        yield cols, table


def dump(
    src,
    path: str | Path,
    format: str = "hdf5",
    mode: str = "overwrite",
    *,
    progress: Callable[[int], None] | None = None,
    **kw,
) -> None:
    """Write every visible episode of ``src`` (a buffer, a view or a ``BufferCore``) to
    ``path``: ``format="hdf5"`` (one file; ``kw``: ``compression``, ``level``) or
    ``"zarr"`` (a buffer directory; ``kw``: ``layout``, ``durable``, ...).  ``mode``:
    ``"overwrite"`` (written aside and renamed in), ``"append"`` (same columns) or
    ``"error"`` (refuse an existing path).  ``progress(k)`` after each batch of ``k``
    episodes is read (episodes are read ~64 MiB at a time and written in whole chunks)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    path = Path(path)
    if mode == "error" and path.exists():
        raise FileExistsError(f"{path} exists (mode='error'); pick another path or mode")
    core = getattr(src, "core", src)
    core.flush()
    if format == "hdf5":
        write_hdf5(episode_batches(core, progress), path, mode, **kw)
    elif format == "zarr":
        _dump_zarr(core, path, mode, progress, **kw)
    else:
        raise ValueError(f"format must be 'hdf5' or 'zarr', got {format!r}")


def _dump_zarr(core: BufferCore, path: Path, mode: str, progress=None, **kw) -> None:
    if mode == "overwrite" and path.exists():
        if not is_buffer(path):
            raise FormatError(f"{path} exists and is not a zreplay buffer; delete it yourself")
        loc = locate(path)
        loc.backend.remove_tree(loc)
    existing = BufferCore.reader(path).num_rows if path.exists() else 0
    need = existing + int(core.episodes().length.sum())
    dst = BufferCore.writer(
        path,
        stream=RandomStream(tag="swm"),
        capacity=max(1, need),
        ram=RamPolicy(enabled=True, trajectories=None, max_bytes=DUMP_RAM_BYTES),
        **kw,
    )
    try:
        for cols, table in episode_batches(core, progress):
            ends = np.cumsum(table["length"])
            items = []
            for a, b in zip(ends - table["length"], ends, strict=True):
                n = int(b - a)
                one = {k: v[a:b, None] for k, v in cols.items()}
                items.append(Prepared(one, n, 1, split_episodes=False))
            dst.add(items)
    finally:
        dst.close()
