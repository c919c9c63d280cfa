"""Other programs' files into new buffers: RLinf buffer directories (``import_rlinf``)
and zreplay HDF5 episode files (``load_hdf5``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..compat.hdf5 import hdf5_info, iter_hdf5
from ..compat.rlinf_files import load_into, read_rlinf_index, rlinf_files
from ..store.guard import new_tree
from ..store.location import locate
from .episode_buffer import ReplayBuffer
from .trajectory_buffer import TrajectoryReplayBuffer


def import_rlinf(
    src_dir: str,
    dst_path: str,
    *,
    allow_pickle: bool = False,
    progress: Callable[[int], None] | None = None,
    overwrite: bool = False,
    **buffer_kwargs,
) -> int:
    """Read an RLinf buffer directory into a new zreplay buffer at ``dst_path``.

    Trajectory ids, order, ``max_episode_length`` and ``model_weights_id`` are kept;
    ``.pt`` files load with ``torch.load(weights_only=True)``; ``.pkl`` files only with
    ``allow_pickle=True``.  ``progress(1)`` is called after each trajectory file is read
    (for progress bars).  ``buffer_kwargs`` go to :class:`TrajectoryReplayBuffer`.
    All or nothing: the buffer is built aside and appears at ``dst_path`` whole; an
    existing buffer there is replaced only with ``overwrite=True`` (never one with a live
    writer), anything else non-empty is refused.  Returns the number of trajectories.
    RLinf's files do not say whether an episode goes on from one trajectory into the
    next: pass ``continue_episodes=True`` (as the buffer that wrote them had) to keep
    such episodes whole.
    """
    src = locate(src_dir)
    meta, ids, index = read_rlinf_index(src)
    fmt = "pt" if meta.get("trajectory_format", "pt") == "pt" else "pkl"  # RLinf's rule
    # Refuse (hostile names, missing files, pickles) before anything is created.
    rlinf_files(src, ids, index, fmt, allow_pickle)
    dst = locate(dst_path, buffer_kwargs.get("storage_options"))
    with new_tree(dst, "import_rlinf", overwrite=overwrite, sources=[src]) as tmp:
        buf = TrajectoryReplayBuffer(
            seed=int(meta.get("seed", 1234)),
            auto_save=True,
            auto_save_path=str(tmp),
            trajectory_format=fmt,
            **buffer_kwargs,
        )
        try:
            load_into(
                buf.core,
                src,
                0,
                1,
                False,
                allow_pickle=allow_pickle,
                progress=progress,
                continues=buf.continue_episodes,
            )
            n = len(buf)
        finally:
            buf.close()
    return n


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
