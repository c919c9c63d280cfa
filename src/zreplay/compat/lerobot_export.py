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
truncation column and the one-step next observations (``next_obs/...``) are not
exported: a LeRobot frame has neither (an episode whose last frame is not done reads as
truncated).  LeRobot's own columns (``timestamp`` = ``frame_index / fps``,
``frame_index``, ``episode_index``, ``index``, ``task_index``) are written afresh; a
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

import io
import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..conventions import DONE_KEYS, NEXT_OBS, REWARD_KEYS, TERMINATION_KEYS, TRUNCATION_KEYS
from ..core import BufferCore
from ..errors import DestinationError, EmptyBufferError, SchemaError
from ..store.guard import new_tree
from ..store.location import locate
from ..threads import import_whole

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
# LeRobot's own per-frame columns, in its order (DEFAULT_FEATURES).
DEFAULT_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
# LeRobot 0.4.4's default encoding (LeRobotDataset.create, video_utils._get_codec_options).
VIDEO_CODEC = "libsvtav1"
VIDEO_PIX_FMT = "yuv420p"
VIDEO_OPTIONS = {"g": "2", "crf": "30", "preset": "12"}
# Camera stats are estimated, as LeRobot 0.4.4 does (compute_stats.sample_images), on
# 100 frames of an episode, each strided down to about 150 pixels a side when larger.
STATS_FRAMES = 100
STATS_SIDE = 150
PNG_LEVEL = 1  # LeRobot's own (image_writer.write_image); PNG is lossless at any level
MB = 1 << 20
EPISODES_PER_FILE = 1000  # rows of a meta/episodes file
VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
IMAGE_MODES = ("video", "image")
UNFINISHED = ("keep", "skip")


def need(module: str):
    """``module`` imported (Ctrl-C safe), or ImportError naming the extra that has it."""
    try:
        return import_whole(module)
    except ImportError:
        raise ImportError(
            f"LeRobot export and import need {module!r}: pip install 'zreplay[lerobot]' "
            "(pyarrow and PyAV)"
        ) from None


# -- which keys become which features --------------------------------------------------


@dataclass
class Feature:
    """One LeRobot feature: its ``name``, the buffer ``key`` it comes from (None for
    LeRobot's own columns), its ``dtype`` (a numpy dtype name, ``"image"`` or
    ``"video"``) and ``shape`` (``[H, W, C]`` for cameras, ``(1,)`` for scalars)."""

    name: str
    key: str | None
    dtype: str
    shape: tuple[int, ...]

    @property
    def camera(self) -> bool:
        return self.dtype in IMAGE_MODES

    def info(self, fps: int) -> dict:
        """The feature as ``info.json`` lists it (a video's probed stream info too)."""
        names = ["height", "width", "channels"] if self.camera else None
        out: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape), "names": names}
        if self.dtype == "video":
            h, w, c = self.shape
            out["info"] = {
                "video.height": h,
                "video.width": w,
                "video.codec": "av1",
                "video.pix_fmt": VIDEO_PIX_FMT,
                "video.is_depth_map": False,
                "video.fps": fps,
                "video.channels": c,
                "has_audio": False,
            }
        return out


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
    # "task": LeRobot's items carry the task string under that name.
    skip = {reward, done, *TRUNCATION_KEYS, *DEFAULT_FEATURES, "task"}
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
            out.append(Feature(feature_name(key), key, images, row))
        elif len(row) <= 1 and dt.kind in "biuf":
            out.append(Feature(feature_name(key), key, dt.name, row or (1,)))
        else:
            raise SchemaError(
                f"key {key!r} ({dt} rows of shape {list(row)}) is no LeRobot feature this "
                "export writes (uint8 [H, W, 3] cameras and numeric rows of at most one axis); "
                "leave it out with keys=[...]"
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
        out.append(Feature("next.reward", reward, dtype, shape))
    if done is not None:
        out.append(Feature("next.done", done, "bool", (1,)))
    names = [f.name for f in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SchemaError(
            f"features {twice} would each come from more than one key (nested keys are "
            "named with '.'); rename the keys or choose some with keys=[...]"
        )
    out += [
        Feature(n, None, "float32" if n == "timestamp" else "int64", (1,)) for n in DEFAULT_FEATURES
    ]
    return out


def feature_name(key: str) -> str:
    """LeRobot's name for buffer key ``key`` (``obs/state`` -> ``obs.state``)."""
    return key.replace("/", ".")


def hf_feature(f: Feature) -> dict:
    """``datasets``' serialized feature type of a data column (LeRobot 0.4.4's
    ``get_hf_features_from_features``: an image is ``Image()``, a one-element row a
    ``Value``, a vector a fixed-length ``List``)."""
    if f.dtype == "image":
        return {"_type": "Image"}
    value = {"dtype": f.dtype, "_type": "Value"}
    if f.shape == (1,):
        return value
    return {"feature": value, "length": int(f.shape[0]), "_type": "List"}


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
        if f.name == "next.done":
            v = v.reshape(n, -1).astype(bool).any(axis=1)
        elif f.name == "next.reward":
            v = v.astype(f.dtype)
        out[f.name] = v.reshape(n, *f.shape) if not f.camera else v
    return out


def png(frame: np.ndarray) -> bytes:
    """A uint8 ``[H, W, 3]`` frame as PNG bytes (lossless)."""
    image = need("PIL.Image")
    buf = io.BytesIO()
    image.fromarray(np.ascontiguousarray(frame)).save(buf, format="PNG", compress_level=PNG_LEVEL)
    return buf.getvalue()


def arrow_column(pa, f: Feature, v: np.ndarray):
    if f.dtype == "image":
        # Pillow's encoder lets go of the GIL: frames are encoded side by side.  Imported
        # here first: threads importing it at once would see it half initialised.
        need("PIL.Image")
        with ThreadPoolExecutor(os.cpu_count() or 2, thread_name_prefix="zreplay-png") as pool:
            data = [{"bytes": b, "path": None} for b in pool.map(png, v)]
        return pa.array(data, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    flat = pa.array(np.ascontiguousarray(v).reshape(-1))
    if f.shape == (1,):
        return flat
    return pa.FixedSizeListArray.from_arrays(flat, int(f.shape[0]))


# -- stats --------------------------------------------------------------------------


def feature_stats(f: Feature, v: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's per-episode stats of ``v`` (``[n, *shape]``): min, max, mean, std,
    count and the quantiles q01..q99, each of the feature's shape (a camera's:
    :func:`camera_stats`)."""
    if f.camera:
        return camera_stats(f, v)
    n = len(v)
    rows = v.reshape(n, -1)
    px = rows.astype(np.float64)
    lo, hi = rows.min(axis=0), rows.max(axis=0)
    if f.dtype != "bool":
        kind = np.float64 if v.dtype.kind == "f" else np.int64
        lo, hi = lo.astype(kind), hi.astype(kind)
    qs = np.quantile(px, list(QUANTILES.values()), axis=0)
    stats = {"min": lo, "max": hi, "mean": px.mean(axis=0), "std": px.std(axis=0)}
    stats.update(zip(QUANTILES, qs, strict=True))
    stats = {k: np.asarray(x).reshape(f.shape) for k, x in stats.items()}
    return {**stats, "count": np.array([n], np.int64)}


def camera_stats(f: Feature, v: np.ndarray) -> dict[str, np.ndarray]:
    """A camera's stats per channel, ``(C, 1, 1)``, of pixels scaled to [0, 1], on the
    frames LeRobot samples (at least 100 of an episode, evenly spaced) strided as it
    strides them (frames of 300 pixels a side or more, down to about 150).  From each
    channel's histogram of uint8 values: exact, and np.quantile's linear quantiles."""
    n, (h, w, c) = len(v), f.shape
    pick = np.unique(np.linspace(0, n - 1, min(n, STATS_FRAMES)).round().astype(np.int64))
    side = max(h, w)
    step = side // STATS_SIDE if side >= 2 * STATS_SIDE else 1
    px = v[pick, ::step, ::step].reshape(-1, c)
    counts = np.stack([np.bincount(px[:, k], minlength=256) for k in range(c)])  # [C, 256]
    values = np.arange(256) / 255.0
    total = len(px)
    mean = counts @ values / total
    var = np.maximum(counts @ values**2 / total - mean**2, 0.0)
    seen = counts > 0
    stats = {
        "min": values[seen.argmax(axis=1)],
        "max": values[255 - seen[:, ::-1].argmax(axis=1)],
        "mean": mean,
        "std": np.sqrt(var),
    }
    cum = np.cumsum(counts, axis=1)
    for name, q in QUANTILES.items():
        pos = q * (total - 1)
        k0 = int(np.floor(pos))
        k1 = min(k0 + 1, total - 1)
        at = [values[[np.searchsorted(cum[ch], k, "right") for k in (k0, k1)]] for ch in range(c)]
        stats[name] = np.array([a + (pos - k0) * (b - a) for a, b in at])
    stats = {k: x.reshape(c, 1, 1) for k, x in stats.items()}
    return {**stats, "count": np.array([n], np.int64)}


class Totals:
    """One feature's stats over all episodes so far, kept as running sums (memory does
    not grow with the episodes): exact min, max, mean, std (pooled) and count;
    quantiles as the count-weighted mean of the episodes' (as LeRobot aggregates them)."""

    def __init__(self):
        self.n = 0
        self.sums: dict[str, np.ndarray] = {}
        self.lo = self.hi = None

    def add(self, stats: dict[str, np.ndarray]) -> None:
        n = int(stats["count"][0])
        mean, std = stats["mean"], stats["std"]
        parts = {"mean": mean, "second": std**2 + mean**2}
        parts.update({q: stats[q] for q in QUANTILES})
        for k, v in parts.items():
            self.sums[k] = self.sums.get(k, 0) + n * v
        self.lo = stats["min"] if self.lo is None else np.minimum(self.lo, stats["min"])
        self.hi = stats["max"] if self.hi is None else np.maximum(self.hi, stats["max"])
        self.n += n

    def result(self) -> dict[str, np.ndarray]:
        mean = self.sums["mean"] / self.n
        var = np.maximum(self.sums["second"] / self.n - mean**2, 0.0)
        out = {"min": self.lo, "max": self.hi, "mean": mean, "std": np.sqrt(var)}
        out["count"] = np.array([self.n], np.int64)
        out.update({q: self.sums[q] / self.n for q in QUANTILES})
        return out


# -- files that roll over between episodes --------------------------------------------


@dataclass
class Rollover:
    """Where the next episode of one kind of file goes: ``(chunk, file)`` moves on when
    the current file holds something and the episode would take it past ``limit``
    bytes; to the next chunk after ``chunks_size`` files (LeRobot's
    ``update_chunk_file_indices``)."""

    limit: int
    chunks_size: int
    chunk: int = 0
    file: int = 0
    used: int = 0

    def place(self, size: int) -> bool:
        """Account an episode of about ``size`` bytes; True if it starts a new file."""
        new = self.used > 0 and self.used + size > self.limit
        if new:
            self.used = 0
            if self.file == self.chunks_size - 1:
                self.chunk, self.file = self.chunk + 1, 0
            else:
                self.file += 1
        self.used += size
        return new


class DataFiles:
    """The data parquet files: one row group per episode."""

    def __init__(self, root: Path, feats: list[Feature], limit: int, chunks_size: int):
        self.pa, self.pq = need("pyarrow"), need("pyarrow.parquet")
        self.root, self.roll = root, Rollover(limit, chunks_size)
        self.feats = [f for f in feats if f.dtype != "video"]
        hf = {"info": {"features": {f.name: hf_feature(f) for f in self.feats}}}
        self.meta = {b"huggingface": json.dumps(hf).encode()}
        self.writer = None
        self.files = 0

    def write(self, columns: dict[str, np.ndarray]) -> tuple[int, int]:
        """Write one episode's frames; its ``(chunk, file)``."""
        pa = self.pa
        arrays = [arrow_column(pa, f, columns[f.name]) for f in self.feats]
        table = pa.Table.from_arrays(arrays, names=[f.name for f in self.feats])
        table = table.replace_schema_metadata(self.meta)
        if self.roll.place(table.nbytes) or self.writer is None:
            self.close()
            path = self.root / DATA_PATH.format(
                chunk_index=self.roll.chunk, file_index=self.roll.file
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = self.pq.ParquetWriter(path, table.schema, compression="snappy")
            self.files += 1
        self.writer.write_table(table)
        return self.roll.chunk, self.roll.file

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class EpisodeFiles:
    """``meta/episodes`` parquet files: one row per episode, ``per_file`` rows a file
    (rows wait in RAM until their file is written)."""

    def __init__(self, root: Path, per_file: int, chunks_size: int):
        self.pa, self.pq = need("pyarrow"), need("pyarrow.parquet")
        self.root, self.per_file = root, per_file
        self.roll = Rollover(per_file, chunks_size)
        self.rows: list[dict] = []
        self.written = 0

    def add(self, row: dict) -> None:
        if self.roll.place(1):
            self.flush()
        row.update(
            {
                "meta/episodes/chunk_index": self.roll.chunk,
                "meta/episodes/file_index": self.roll.file,
            }
        )
        self.rows.append(row)

    def flush(self) -> None:
        if not self.rows:
            return
        first = self.rows[0]
        path = self.root / EPISODES_PATH.format(
            chunk_index=first["meta/episodes/chunk_index"],
            file_index=first["meta/episodes/file_index"],
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        self.pq.write_table(self.pa.Table.from_pylist(self.rows), path, compression="snappy")
        self.written += len(self.rows)
        self.rows = []


class VideoFiles:
    """One camera's mp4 files: episodes encoded back to back in one AV1 stream per
    file, frame ``i`` of a file at ``i / fps`` seconds, so an episode spans
    ``[first / fps, (last + 1) / fps)`` of it."""

    def __init__(self, root: Path, f: Feature, fps: int, limit: int, chunks_size: int):
        self.av = need("av")
        self.root, self.f, self.fps = root, f, fps
        self.roll = Rollover(limit, chunks_size)
        self.container = self.stream = None
        self.frames = 0  # frames in the current file
        self.bytes_per_frame = f.shape[0] * f.shape[1] * 3 / 50  # until measured
        self.files = 0

    def write(self, frames: np.ndarray) -> tuple[int, int, float, float]:
        """Encode one episode; ``(chunk, file, from_timestamp, to_timestamp)``."""
        if self.roll.place(int(self.bytes_per_frame * len(frames))) or self.container is None:
            self.close()
            self._open()
        first = self.frames
        for frame in frames:
            vf = self.av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            vf.pts = self.frames
            self.frames += 1
            self._mux(self.stream.encode(vf))
        # What the encoder has handed out so far (it holds a few frames back).
        if self.encoded:
            self.bytes_per_frame = self.encoded / self.frames
            self.roll.used = max(self.roll.used, self.encoded)
        return self.roll.chunk, self.roll.file, first / self.fps, self.frames / self.fps

    def _open(self) -> None:
        av, (h, w, _) = self.av, self.f.shape
        path = self.root / VIDEO_PATH.format(
            video_key=self.f.name, chunk_index=self.roll.chunk, file_index=self.roll.file
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        self.container = av.open(str(path), "w")
        self.stream = self.container.add_stream(VIDEO_CODEC, self.fps, options=VIDEO_OPTIONS)
        self.stream.pix_fmt, self.stream.width, self.stream.height = VIDEO_PIX_FMT, w, h
        self.frames = self.encoded = 0
        self.files += 1

    def _mux(self, packets) -> None:
        for p in packets:
            self.encoded += p.size
        self.container.mux(packets)

    def close(self) -> None:
        """Flush the encoder and close the file (nothing to do when none is open)."""
        if self.container is None:
            return
        try:
            self._mux(self.stream.encode())
            if self.frames:
                self.bytes_per_frame = self.encoded / self.frames
        finally:
            self.container.close()
            self.container = self.stream = None

    def abandon(self) -> None:
        """Close without flushing (the export failed; the file is thrown away)."""
        if self.container is not None:
            try:
                self.container.close()
            except Exception:
                pass
            self.container = self.stream = None


# -- metadata -----------------------------------------------------------------------


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4, ensure_ascii=False))


def write_tasks(pa, pq, path: Path, tasks: list[str]) -> None:
    """``meta/tasks.parquet`` as pandas writes a frame indexed by task string with a
    ``task_index`` column (LeRobot reads it with ``pd.read_parquet``)."""
    pandas = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }
    table = pa.table(
        {
            "task_index": pa.array(np.arange(len(tasks), dtype=np.int64)),
            "__index_level_0__": pa.array(tasks, pa.string()),
        }
    ).replace_schema_metadata({b"pandas": json.dumps(pandas).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def nested(stats: dict[str, np.ndarray]) -> dict[str, Any]:
    return {k: v.tolist() for k, v in stats.items()}


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
    task: str | Sequence[str] = "",
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
    every episode, or one per exported episode; ``keys``: the buffer keys to export
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
    if images == "video":
        need("av")
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
        tasks = _tasks(task, len(plan.exported))
        with new_tree(out, "export_lerobot", overwrite=False, sources=[core.path]) as tmp:
            _write(
                core,
                tmp,
                feats,
                plan,
                tasks,
                fps,
                robot_type,
                report,
                progress,
                int(data_file_size_mb * MB),
                int(video_file_size_mb * MB),
                chunks_size,
                (data_file_size_mb, video_file_size_mb),
            )
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


def _tasks(task, n: int) -> list[str]:
    if isinstance(task, str):
        return [task] * n
    tasks = list(task)
    if len(tasks) != n or not all(isinstance(t, str) for t in tasks):
        raise ValueError(
            f"task must be one string, or one string per exported episode ({n}); got "
            f"{len(tasks)} values"
        )
    return tasks


def _write(
    core,
    root: Path,
    feats,
    plan,
    tasks,
    fps,
    robot_type,
    report,
    progress,
    data_limit,
    video_limit,
    chunks_size,
    sizes_mb,
) -> None:
    pa, pq = need("pyarrow"), need("pyarrow.parquet")
    task_ids = {t: i for i, t in enumerate(dict.fromkeys(tasks))}
    data = DataFiles(root, feats, data_limit, chunks_size)
    videos = {
        f.name: VideoFiles(root, f, fps, video_limit, chunks_size)
        for f in feats
        if f.dtype == "video"
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
    write_tasks(pa, pq, root / "meta/tasks.parquet", list(task_ids))
    write_json(root / "meta/stats.json", {n: nested(t.result()) for n, t in totals.items()})
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": table.written,
        "total_frames": index,
        "total_tasks": len(task_ids),
        "chunks_size": chunks_size,
        "data_files_size_in_mb": sizes_mb[0],
        "video_files_size_in_mb": sizes_mb[1],
        "fps": fps,
        "splits": {"train": f"0:{table.written}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if videos else None,
        "features": {f.name: f.info(fps) for f in feats},
    }
    write_json(root / "meta/info.json", info)
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
