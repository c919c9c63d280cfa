"""``zreplay export`` and ``zreplay import``: RLinf 0.3 files and HDF5 episode files.

* ``export PATH OUT --format pt|pkl``: RLinf's directory layout (``export_rlinf``), read
  through a read-only view, so every segment is exported, no writer lock is taken and
  nothing is written to the source; ``--format hdf5``: :func:`zreplay.dump` of the view;
  ``--format lerobot``: :func:`zreplay.export_lerobot` of the view (``--fps``,
  ``--images video|image``, ``--task``) to a new directory.
* ``import SRC DST``: an RLinf directory through :func:`zreplay.import_rlinf`
  (trajectories, ids and metadata kept), a zreplay HDF5 file's episodes written with
  :class:`zreplay.ReplayBuffer` (one trajectory ``[L, 1]`` per episode), a local LeRobot
  dataset (v3.0, v2.1) through :func:`zreplay.import_lerobot`, or a Minari dataset
  (``data/metadata.json``) through :func:`zreplay.import_minari`; ``IMPORTS`` is the table
  of what it recognises, in order.

Outputs are never clobbered without ``--overwrite``, and every output is built aside and
swapped in whole: a failed export or import leaves what was at the output path (or
nothing) as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..compat.lerobot_format import is_lerobot_dir
from ..compat.minari import is_minari_dataset
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
    if args.format == "lerobot":  # to a new directory only (export_lerobot refuses others)
        n = view.num_episodes
        with progress(args, n, "export", "episode") as bar:
            report = zreplay.export_lerobot(
                view, out, fps=args.fps, images=args.images, task=args.task, progress=bar.update
            )
        result.update(
            episodes=report.episodes,
            frames=report.frames,
            skipped_partial=report.skipped_partial,
            features=sorted(report.features),
        )
        done = (
            f"wrote {report.episodes} episodes ({report.frames} frames) as a LeRobot v3.0 "
            f"dataset to {out}"
        )
    elif args.format == "hdf5":
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

    src, dst = existing(args.src), locate(args.dst)  # an s3:// URL stays one
    kind, read = next(
        ((k, r) for k, (is_kind, r, _) in IMPORTS.items() if is_kind(src)), (None, None)
    )
    if kind is None:
        what = " nor ".join(w for _, _, w in IMPORTS.values())
        raise FormatError(f"{src} is neither {what}")
    if args.overwrite and dst.backend.is_local and dst.is_dir() and writer_locks(dst):
        raise FileExistsError(
            f"{dst} has a writer lock ({writer_locks(dst)[0]}): a writer may be running. "
            "Stop it (or delete the lock if it is gone) before overwriting"
        )
    check_output(dst, args.overwrite, is_buffer, "a zreplay buffer")
    report = read(args, src, dst)
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
    if report is not None:  # what the importer itself says it read
        result.update(report=vars(report))
        done = str(report)
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


def _import_lerobot(args, src: Path, dst: Path):
    from ..compat.lerobot import import_lerobot
    from ..compat.lerobot_format import read_info

    with progress(args, read_info(src).total_frames, "import", "frame") as bar:
        return import_lerobot(src, dst, overwrite=args.overwrite, progress=bar.update)


def _import_minari(args, src: Path, dst: Path) -> None:
    from ..compat.minari import import_minari

    with progress(args, None, "import", "episode") as bar:
        import_minari(src, dst, overwrite=args.overwrite, progress=bar.update)


def _local(is_kind):
    return lambda p: p.backend.is_local and is_kind(p)


# What `zreplay import SRC DST` reads, tried in order: kind -> (is SRC one, import it into
# DST (returns a report with a __str__, or None), what it is in an error).  A new source
# format is one row.
IMPORTS = {
    "rlinf": (
        is_rlinf_dir,
        _import_rlinf,
        "an RLinf buffer directory (metadata.json + trajectory_index.json)",
    ),
    "hdf5": (is_hdf5, _import_hdf5, "a zreplay HDF5 episode file"),
    "lerobot": (
        _local(is_lerobot_dir),
        _import_lerobot,
        "a local LeRobot dataset directory (meta/info.json of codebase version v3.0 or v2.1)",
    ),
    "minari": (_local(is_minari_dataset), _import_minari, "a Minari dataset (data/metadata.json)"),
}
