"""``zreplay export`` and ``zreplay import``: RLinf 0.3 files and HDF5 episode files.

* ``export PATH OUT --format pt|pkl``: RLinf's directory layout (``export_rlinf``), read
  through a read-only view, so every segment is exported, no writer lock is taken and
  nothing is written to the source; ``--format hdf5``: :func:`zreplay.dump` of the view.
* ``import SRC DST``: an RLinf directory through :func:`zreplay.import_rlinf`
  (trajectories, ids and metadata kept), or a zreplay HDF5 file's episodes written with
  :class:`zreplay.ReplayBuffer` (one trajectory ``[L, 1]`` per episode).

Outputs are never clobbered without ``--overwrite``, and every output is built aside and
swapped in whole: a failed export or import leaves what was at the output path (or
nothing) as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import FormatError, PickleRefusedError
from ..store.guard import new_tree
from ..store.location import locate
from .output import EXIT_OK, Result, progress, size
from .paths import buffer_dir, check_output, du, existing, is_hdf5, is_rlinf_dir, writer_locks


def _sampler_seed(view) -> int:
    """The seed a TrajectoryReplayBuffer saved with its commits (RLinf's metadata field)."""
    for _wid, commit in view.core.engine.segments():
        if "seed" in commit.sampler:
            return int(commit.sampler["seed"])
    return 1234  # TrajectoryReplayBuffer's default seed


def run_export(args) -> Result:
    import zreplay

    from ..compat.rlinf_files import export_rlinf

    view = zreplay.open(buffer_dir(args.path))
    out = Path(args.out)
    result: dict[str, Any] = {"path": str(view.path), "out": str(out), "format": args.format}
    if args.format == "hdf5":
        check_output(out, args.overwrite, is_hdf5, "an HDF5 file")
        n = view.num_episodes
        with progress(args, n, "export", "episode") as bar:
            zreplay.dump(view, out, format="hdf5", progress=bar.update)
        result.update(episodes=n, rows=view.num_rows)
        done = f"wrote {n} episodes ({view.num_rows} steps) to {out}"
    else:
        check_output(out, args.overwrite, is_rlinf_dir, "an RLinf buffer directory")
        with progress(args, view.num_trajectories, "export", "traj") as bar:
            n = export_rlinf(view.core, out, args.format, _sampler_seed(view), bar.update)
        result.update(trajectories=n, rows=view.num_rows)
        done = (
            f"wrote {n} trajectories ({view.num_rows} rows) as RLinf .{args.format} files to {out}"
        )
    result["disk_bytes"] = du(out)
    return EXIT_OK, result, f"{done} ({size(result['disk_bytes'])})"


def run_import(args) -> Result:
    import zreplay

    from ..store.root import is_buffer

    src, dst = existing(args.src), Path(args.dst)
    if is_rlinf_dir(src):
        kind = "rlinf"
    elif is_hdf5(src):
        kind = "hdf5"
    else:
        raise FormatError(
            f"{src} is neither an RLinf buffer directory (metadata.json + "
            "trajectory_index.json) nor a zreplay HDF5 episode file"
        )
    if args.overwrite and dst.is_dir() and writer_locks(dst):
        raise FileExistsError(
            f"{dst} has a writer lock ({writer_locks(dst)[0]}): a writer may be running. "
            "Stop it (or delete the lock if it is gone) before overwriting"
        )
    check_output(dst, args.overwrite, is_buffer, "a zreplay buffer")
    (_import_rlinf if kind == "rlinf" else _import_hdf5)(args, src, dst)
    view = zreplay.open(dst)
    result = {
        "src": str(src),
        "dst": str(dst),
        "kind": kind,
        "trajectories": view.num_trajectories,
        "episodes": view.num_episodes,
        "rows": view.num_rows,
    }
    done = (
        f"imported {view.num_trajectories} trajectories, {view.num_episodes} episodes, "
        f"{view.num_rows} rows from {src} ({kind}) into {dst}"
    )
    return EXIT_OK, result, done


def _import_rlinf(args, src: Path, dst: Path) -> None:
    import zreplay

    from ..compat.rlinf_files import read_rlinf_index

    _meta, ids, _index = read_rlinf_index(src)
    try:
        with progress(args, len(ids), "import", "traj") as bar:
            zreplay.import_rlinf(
                str(src),
                str(dst),
                allow_pickle=args.allow_pickle,
                progress=bar.update,
                overwrite=args.overwrite,
            )
    except PickleRefusedError as e:
        raise PickleRefusedError(f"{e} (on the command line: --allow-pickle)") from None


def _import_hdf5(args, src: Path, dst: Path) -> None:
    import zreplay

    from ..compat.hdf5 import hdf5_info

    info = hdf5_info(src)
    with new_tree(locate(dst), "import", overwrite=args.overwrite) as tmp:  # all or nothing
        rb = zreplay.ReplayBuffer(max(1, info["steps"]), path=tmp)
        try:
            with progress(args, info["episodes"], "import", "episode") as bar:
                for episode in zreplay.iter_hdf5(src):
                    rb.write_episode(episode)
                    bar.update(1)
        finally:
            rb.close()
