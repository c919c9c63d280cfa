"""A buffer's episodes as a LeRobot v3.0 dataset: :func:`export_lerobot`.

What LeRobot 0.4.4's ``LeRobotDataset(repo_id, root=dst)`` loads, offline::

    meta/info.json                       codebase_version "v3.0", fps, features, paths, totals
    meta/stats.json                      every feature's stats over all exported frames
    meta/tasks.parquet                   task strings (the pandas index) -> task_index
    meta/episodes/chunk-000/file-000.parquet
                                         one row per episode: length, tasks, where its rows
                                         and video frames are, its own stats
    data/chunk-XXX/file-YYY.parquet      the frames of whole episodes, one row group each
    videos/<camera>/chunk-XXX/file-YYY.mp4
                                         a camera's frames of whole episodes, back to back

Buffer keys become features by what they hold: uint8 ``[H, W, 3]`` rows are cameras
(``video``: AV1 with LeRobot's default encoding, lossy; ``image``: PNG in the parquet,
lossless); other numeric rows of at most one axis are numeric features (a scalar row is
shape ``(1,)``); the reward column (``rewards``/``reward``) becomes ``next.reward`` and
the termination column (``terminated``/``terminations``, else ``dones``/``done``)
``next.done``.  Nested keys are named with ``.`` (``obs/state`` -> ``obs.state``).  The
truncation column, the other flag columns (``dones`` beside ``terminated``) and the
one-step next observations (``next_obs/...``) are not exported: a LeRobot frame has
none of them (an episode whose last frame is not done reads as truncated).  LeRobot's
own columns (``timestamp`` = ``frame_index / fps``, ``frame_index``,
``episode_index``, ``index``, ``task_index``) are written afresh; a
buffer key of one of those names, or named ``task`` (LeRobot's items carry the task
string under it), is left out.

Only whole episodes are exported: one whose first steps were evicted is skipped (and
counted).  An episode whose last step is neither terminated nor truncated may still be
growing; ``unfinished="keep"`` (the default: buffers of stable-worldmodel episodes carry
no end flags) exports it as it is now, ``"skip"`` leaves it out.

Files roll over by size between episodes, never inside one (``data_file_size_mb``,
``video_file_size_mb``: LeRobot's ``data_files_size_in_mb``/``video_files_size_in_mb``),
and to the next chunk directory after ``chunks_size`` files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..conventions import DONE_KEYS, NEXT_OBS, REWARD_KEYS, TERMINATION_KEYS, TRUNCATION_KEYS
from ..core import BufferCore
from ..errors import DestinationError, EmptyBufferError, SchemaError
from ..store.guard import new_tree
from ..store.location import locate
from .lerobot import imported_tasks
from .lerobot_files import (
    EPISODES_PER_FILE,
    MB,
    VIDEO_COLUMNS,
    DataFiles,
    EpisodeFiles,
    VideoFiles,
    write_json,
    write_tasks,
)
from .lerobot_format import (
    ARRAY,
    DEFAULT_FEATURES,
    DONE,
    IMAGE_MODES,
    INFO,
    REWARD,
    STATS_PATH,
    V30,
    V30_DATA_PATH,
    V30_TASKS_PATH,
    V30_VIDEO_PATH,
    VIDEO,
    Feature,
    default_features,
    need,
)
from .lerobot_stats import Totals, feature_stats, nested

UNFINISHED = ("keep", "skip")
# The smallest frame side exported as AV1 video (SVT-AV1 dies with SIGFPE on 16x16, 24x24).
MIN_VIDEO_SIDE = 32


# -- which keys become which features --------------------------------------------------


# LeRobot 0.4.4 stores a numeric row of up to 5 axes (datasets' Array2D..Array5D).
MAX_AXES = 5


def lerobot_features(core: BufferCore, images: str, keys: Sequence[str] | None) -> list[Feature]:
    """The features an export of ``core`` writes, the buffer's own then LeRobot's
    (see the module docstring); SchemaError for a key no LeRobot feature can hold."""
    specs = core.schema.specs
    if keys is None:
        keys = [k for k in specs if k.split("/")[0] != NEXT_OBS]
    else:
        missing = [k for k in keys if k not in specs]
        if missing:
            raise SchemaError(f"keys {missing} are not in the buffer; it has {sorted(specs)}")
    reward = next((k for k in REWARD_KEYS if k in keys), None)
    done = next((k for k in (*TERMINATION_KEYS, *DONE_KEYS) if k in keys), None)
    # The other flag columns say how episodes end, which next.done and the episode
    # table say; "task": LeRobot's items carry the task string under that name.
    flags = {*TERMINATION_KEYS, *DONE_KEYS, *TRUNCATION_KEYS}
    skip = {reward, *flags, *DEFAULT_FEATURES, "task"}
    out: list[Feature] = []
    for key in keys:
        if key in skip:
            continue
        spec = specs[key]
        row, dt = tuple(spec.row_shape), spec.dtype
        if dt == np.uint8 and len(row) == 3 and row[2] == 3:
            if images == "video" and (row[0] % 2 or row[1] % 2):
                raise SchemaError(
                    f"key {key!r}: frames of {row[0]}x{row[1]} cannot be AV1 yuv420p video "
                    "(height and width must be even); export with images='image' (PNG)"
                )
            if images == "video" and min(row[:2]) < MIN_VIDEO_SIDE:
                # SVT-AV1 kills the process (SIGFPE) on frames this small (16x16, 64x16).
                raise SchemaError(
                    f"key {key!r}: frames of {row[0]}x{row[1]} are too small for the AV1 "
                    f"encoder (both sides at least {MIN_VIDEO_SIDE}); export with "
                    "images='image' (PNG)"
                )
            out.append(Feature(feature_name(key), images, np.dtype(np.uint8), row, key))
        elif len(row) <= MAX_AXES and dt.kind in "biuf":
            out.append(Feature(feature_name(key), ARRAY, dt, row or (1,), key))
        else:
            raise SchemaError(
                f"key {key!r} ({dt} rows of shape {list(row)}) is no LeRobot feature this "
                f"export writes (uint8 [H, W, 3] cameras and numeric rows of at most "
                f"{MAX_AXES} axes, LeRobot 0.4.4's Array5D); leave it out with keys=[...]"
            )
    if reward is not None:
        spec = specs[reward]
        dtype = spec.dtype.name if spec.dtype.kind == "f" else "float32"
        shape = tuple(spec.row_shape) if len(spec.row_shape) == 1 else (1,)
        if len(spec.row_shape) > 1:
            raise SchemaError(
                f"reward key {reward!r} has rows of shape {list(spec.row_shape)}; "
                "next.reward takes a scalar or a vector per frame"
            )
        out.append(Feature(REWARD, ARRAY, np.dtype(dtype), shape, reward))
    if done is not None:
        out.append(Feature(DONE, ARRAY, np.dtype(bool), (1,), done))
    names = [f.name for f in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SchemaError(
            f"features {twice} would each come from more than one key (nested keys are "
            "named with '.'); rename the keys or choose some with keys=[...]"
        )
    return out + default_features()


def feature_name(key: str) -> str:
    """LeRobot's name for buffer key ``key`` (``obs/state`` -> ``obs.state``)."""
    return key.replace("/", ".")


# -- frames -------------------------------------------------------------------------


def frame_columns(
    feats: list[Feature], cols: dict[str, np.ndarray], n: int
) -> dict[str, np.ndarray]:
    """One episode's buffer columns as ``{feature name: [n, *shape]}`` (next.done from
    the flag column, any flag in a row)."""
    out = {}
    for f in feats:
        if f.key is None:
            continue
        v = cols[f.key]
        if f.name == DONE:
            v = v.reshape(n, -1).astype(bool).any(axis=1)
        elif f.name == REWARD:
            v = v.astype(f.dtype)
        out[f.name] = v.reshape(n, *f.shape) if not f.is_frame else v
    return out


# -- the export ---------------------------------------------------------------------


@dataclass
class LeRobotExport:
    """What :func:`export_lerobot` wrote: ``episodes`` and ``frames`` exported,
    ``skipped_partial`` (episodes whose first steps were evicted), ``skipped_unfinished``
    (with ``unfinished="skip"``), the ``features`` (name -> info.json entry), and how
    many ``data_files`` and ``video_files`` (all cameras)."""

    path: str
    episodes: int = 0
    frames: int = 0
    skipped_partial: int = 0
    skipped_unfinished: int = 0
    features: dict[str, dict] = field(default_factory=dict)
    data_files: int = 0
    video_files: int = 0


def _check_options(fps, images, unfinished, sizes: dict[str, Any]) -> None:
    if isinstance(fps, bool) or not isinstance(fps, int) or fps <= 0:
        raise ValueError(
            f"fps must be a positive int (LeRobot's info.json has an int), got {fps!r}"
        )
    if images not in IMAGE_MODES:
        raise ValueError(f"images must be one of {IMAGE_MODES}, got {images!r}")
    if unfinished not in UNFINISHED:
        raise ValueError(f"unfinished must be one of {UNFINISHED}, got {unfinished!r}")
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")


def export_lerobot(
    buffer,
    dst: str | Path,
    *,
    fps: int = 30,
    images: str = "video",
    task: str | Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    unfinished: str = "keep",
    robot_type: str | None = None,
    data_file_size_mb: float = 100,
    video_file_size_mb: float = 200,
    chunks_size: int = 1000,
    storage_options: dict | None = None,
    progress: Callable[[int], None] | None = None,
) -> LeRobotExport:
    """Write the whole episodes of ``buffer`` (a buffer's path or URL, an open buffer or a
    view) as a LeRobot v3.0 dataset in the new local directory ``dst``.

    ``fps``: the frame rate LeRobot records (timestamps are ``frame_index / fps``);
    ``images``: ``"video"`` (AV1 mp4, LeRobot's default, lossy) or ``"image"`` (PNG in
    the parquet, lossless) for uint8 ``[H, W, 3]`` keys; ``task``: one task string for
    every episode, or one per exported episode (default: the task each episode had when
    :func:`~zreplay.import_lerobot` made the buffer, ``""`` for episodes added since);
    ``keys``: the buffer keys to export
    (default: all but ``next_obs``); ``unfinished``: ``"keep"`` or ``"skip"`` episodes
    with no end flag yet; ``progress(1)`` after each episode.  Which key becomes which
    feature: see :mod:`zreplay.compat.lerobot_export`.  All or nothing: built beside
    ``dst`` and renamed in whole; an existing ``dst`` is refused (DestinationError).
    Returns a :class:`LeRobotExport` report.  Needs ``pip install 'zreplay[lerobot]'``.
    """
    _check_options(
        fps,
        images,
        unfinished,
        {"data_file_size_mb": data_file_size_mb, "video_file_size_mb": video_file_size_mb},
    )
    if isinstance(chunks_size, bool) or not isinstance(chunks_size, int) or chunks_size <= 0:
        raise ValueError(f"chunks_size must be a positive int, got {chunks_size!r}")
    need("pyarrow")
    out = locate(dst)
    if not out.backend.is_local:
        raise DestinationError(f"export_lerobot writes a local directory; {out} is not one")
    if out.exists():
        raise DestinationError(
            f"export_lerobot: {out} exists (LeRobot datasets are written to a new "
            "directory); pick a new path or delete it first"
        )
    opened = isinstance(buffer, str | Path)
    core = (
        BufferCore.reader(locate(buffer, storage_options))
        if opened
        else getattr(buffer, "core", buffer)
    )
    view = None
    try:
        if core.writable:
            core.flush()
            if core.view_rows is not None:  # a ZarrStorage ring: what a view of it shows
                view = core = BufferCore.reader(core.path, storage_options=core.storage_options)
        plan = _episode_plan(core, unfinished)
        if not len(plan.exported):
            raise EmptyBufferError(
                f"{core.path} has no whole episodes to export ({plan.describe()}); a LeRobot "
                "dataset needs at least one"
            )
        feats = lerobot_features(core, images, keys)
        report = LeRobotExport(str(out))
        report.skipped_partial, report.skipped_unfinished = plan.skipped
        tasks = _tasks(task, core, plan)
        files = Files(fps, robot_type, data_file_size_mb, video_file_size_mb, chunks_size)
        with new_tree(out, "export_lerobot", overwrite=False, sources=[core.path]) as tmp:
            _write(core, tmp, feats, plan, tasks, files, report, progress)
        return report
    finally:
        if view is not None:
            view.close()
        if opened:
            core.close()


@dataclass
class EpisodePlan:
    exported: np.ndarray  # positions in the buffer's episode table, oldest first
    skipped: tuple[int, int]  # (partial, unfinished)

    def describe(self) -> str:
        p, u = self.skipped
        return f"{p} partly evicted and {u} unfinished episodes skipped"


def _episode_plan(core: BufferCore, unfinished: str) -> EpisodePlan:
    table = core.episode_table()
    whole = table["first_step"] == 0
    ended = table["terminated"] | table["truncated"]
    keep = whole & (ended | (unfinished == "keep"))
    skipped = (int((~whole).sum()), int((whole & ~keep).sum()))
    return EpisodePlan(np.flatnonzero(keep), skipped)


def _tasks(task, core: BufferCore, plan: EpisodePlan) -> list[str]:
    n = len(plan.exported)
    if task is None:
        known = imported_tasks(core.path) or {}
        ids = core.episode_table()["episode"][plan.exported]
        return [known.get(int(e), "") for e in ids]
    if isinstance(task, str):
        return [task] * n
    tasks = list(task)
    if len(tasks) != n or not all(isinstance(t, str) for t in tasks):
        raise ValueError(
            f"task must be one string, or one string per exported episode ({n}); got "
            f"{len(tasks)} values"
        )
    return tasks


@dataclass(frozen=True)
class Files:
    """How the dataset's files are laid out: its ``fps``, ``robot_type``, the sizes
    (MB) data and video files roll over at, and files per chunk directory."""

    fps: int
    robot_type: str | None
    data_file_size_mb: float
    video_file_size_mb: float
    chunks_size: int


def _write(core, root: Path, feats, plan, tasks, files: Files, report, progress) -> None:
    fps, chunks_size = files.fps, files.chunks_size
    pa, pq = need("pyarrow"), need("pyarrow.parquet")
    task_ids = {t: i for i, t in enumerate(dict.fromkeys(tasks))}
    data = DataFiles(root, feats, int(files.data_file_size_mb * MB), chunks_size)
    videos = {
        f.name: VideoFiles(root, f, fps, int(files.video_file_size_mb * MB), chunks_size)
        for f in feats
        if f.kind == VIDEO
    }
    table = EpisodeFiles(root, EPISODES_PER_FILE, chunks_size)
    totals = {f.name: Totals() for f in feats}
    index = 0
    try:
        for i, frames in enumerate(_episodes(core, feats, plan, fps)):
            n = len(frames["frame_index"])
            frames["episode_index"] = np.full(n, i, np.int64)
            frames["index"] = np.arange(index, index + n, dtype=np.int64)
            frames["task_index"] = np.full(n, task_ids[tasks[i]], np.int64)
            chunk, file = data.write(frames)
            row = {
                "episode_index": i,
                "tasks": [tasks[i]],
                "length": n,
                "data/chunk_index": chunk,
                "data/file_index": file,
                "dataset_from_index": index,
                "dataset_to_index": index + n,
            }
            for name, vf in videos.items():
                where = dict(zip(VIDEO_COLUMNS, vf.write(frames[name]), strict=True))
                row.update({f"videos/{name}/{k}": v for k, v in where.items()})
            for f in feats:
                stats = feature_stats(f, frames[f.name])
                totals[f.name].add(stats)
                row.update({f"stats/{f.name}/{k}": v.tolist() for k, v in stats.items()})
            table.add(row)
            index += n
            if progress is not None:
                progress(1)
        table.flush()
        data.close()
        for vf in videos.values():
            vf.close()
    except BaseException:
        data.close()
        for vf in videos.values():
            vf.abandon()
        raise
    write_tasks(pa, pq, root / V30_TASKS_PATH, list(task_ids))
    write_json(root / STATS_PATH, {n: nested(t.result()) for n, t in totals.items()})
    info = {
        "codebase_version": V30,
        "robot_type": files.robot_type,
        "total_episodes": table.written,
        "total_frames": index,
        "total_tasks": len(task_ids),
        "chunks_size": chunks_size,
        "data_files_size_in_mb": files.data_file_size_mb,
        "video_files_size_in_mb": files.video_file_size_mb,
        "fps": fps,
        "splits": {"train": f"0:{table.written}"},
        "data_path": V30_DATA_PATH,
        "video_path": V30_VIDEO_PATH if videos else None,
        "features": {f.name: f.info(fps) for f in feats},
    }
    write_json(root / INFO, info)
    report.episodes, report.frames = table.written, index
    report.features = info["features"]
    report.data_files = data.files
    report.video_files = sum(v.files for v in videos.values())


def _episodes(core, feats: list[Feature], plan: EpisodePlan, fps: int):
    """The exported episodes' frames, oldest first: ``{feature name: [n, ...]}`` with
    ``timestamp`` and ``frame_index`` (read ~64 MiB of episodes at a time)."""
    wanted = [f.key for f in feats if f.key is not None]
    todo = set(plan.exported.tolist())
    e, stop = int(plan.exported[0]), int(plan.exported.max()) + 1
    while e < stop:
        cols, table = core.episodes_from(e, keys=wanted)
        ends = np.cumsum(table["length"])
        for j, (a, b) in enumerate(zip(ends - table["length"], ends, strict=True)):
            if e + j in todo:
                n = int(b - a)
                frames = frame_columns(feats, {k: v[a:b] for k, v in cols.items()}, n)
                frames["timestamp"] = (np.arange(n) / fps).astype(np.float32)
                frames["frame_index"] = np.arange(n, dtype=np.int64)
                yield frames
        e += len(table["length"])
