"""Other programs' files into new buffers: RLinf buffer directories (``import_rlinf``)
and zreplay HDF5 episode files (``load_hdf5``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..compat.hdf5 import hdf5_info, iter_hdf5
from ..compat.rlinf_files import load_into, read_rlinf_index, rlinf_files
from .episode_buffer import ReplayBuffer
from .trajectory_buffer import TrajectoryReplayBuffer


def import_rlinf(
    src_dir: str,
    dst_path: str,
    *,
    allow_pickle: bool = False,
    progress: Callable[[int], None] | None = None,
    **buffer_kwargs,
) -> int:
    """Read an RLinf buffer directory into a new zreplay buffer at ``dst_path``.

    Trajectory ids, order, ``max_episode_length`` and ``model_weights_id`` are kept;
    ``.pt`` files load with ``torch.load(weights_only=True)``; ``.pkl`` files only with
    ``allow_pickle=True``.  ``progress(1)`` is called after each trajectory file is read
    (for progress bars).  ``buffer_kwargs`` go to :class:`TrajectoryReplayBuffer`.
    Returns the number of trajectories imported.
    """
    src = Path(src_dir)
    meta, ids, index = read_rlinf_index(src)
    # Refuse (hostile names, missing files, pickles) before anything is created.
    rlinf_files(src, ids, index, meta.get("trajectory_format", "pt"), allow_pickle)
    buf = TrajectoryReplayBuffer(
        seed=int(meta.get("seed", 1234)),
        auto_save=True,
        auto_save_path=str(dst_path),
        trajectory_format=meta.get("trajectory_format", "pt"),
        **buffer_kwargs,
    )
    try:
        load_into(buf.core, src, 0, 1, False, allow_pickle=allow_pickle, progress=progress)
        return len(buf)
    finally:
        buf.close()


def load_hdf5(h5_path: str | Path, max_steps: int | None = None, **kw) -> ReplayBuffer:
    """A :class:`ReplayBuffer` holding the episodes of a zreplay HDF5 file (``max_steps``
    defaults to the file's total steps; ``kw`` go to ``ReplayBuffer``, e.g. ``path=`` for
    a persistent buffer)."""
    info = hdf5_info(h5_path)
    rb = ReplayBuffer(max(1, max_steps or info["steps"]), **kw)
    try:
        rb.write_episodes(iter_hdf5(h5_path))
        rb.flush()
    except BaseException:
        rb.close()
        raise
    return rb
