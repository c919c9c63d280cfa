"""A local LeRobot dataset (v3.0 or v2.1) read episode by episode, without LeRobot: the
plan (episodes in ``episode_index`` order, where each one's rows and frames are, the task
strings), then each episode's columns under their LeRobot names, ``[L, ...]`` arrays.

Rows come from one data parquet file at a time; frames of ``video`` features are decoded
once, sequentially per mp4 (PyAV), one episode's frames in memory; ``image`` features
(PNG or JPEG in the parquet) are decoded per row.  Everything read is checked against
``info.json`` and the episodes metadata, and a mismatch is a ``FormatError`` naming the
file and the episode.  pyarrow and PyAV are imported when first needed
(``pip install 'zreplay[lerobot]'``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError
from .lerobot_format import (
    IMAGE,
    V21,
    V21_EPISODES_PATH,
    V21_TASKS_PATH,
    V30_TASKS_PATH,
    VIDEO,
    Feature,
    Info,
    dataset_file,
    need,
)

# LeRobot's reader takes a frame within this many seconds of the time it asks for.
TOLERANCE_S = 1e-4
# Frames of each channel count as PyAV converts them.
PIX_FMT = {1: "gray", 3: "rgb24", 4: "rgba"}


@dataclass
class Episode:
    """Where one LeRobot episode's rows and frames are: its ``data`` file (the rows
    ``rows`` of the dataset's ``index`` in v3.0, the whole file in v2.1) and, per video
    key, ``(mp4, from_timestamp, to_timestamp)``."""

    index: int
    length: int
    tasks: list[str]
    data: Path
    rows: tuple[int, int] | None
    videos: dict[str, tuple[Path, float, float]] = field(default_factory=dict)


# -- the plan: episodes, tasks, files -------------------------------------------------


def _jsonl(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise FormatError(f"{path} is missing; a LeRobot v2.1 dataset has one") from None
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise FormatError(f"{path}, line {i + 1}: not JSON ({e})") from None
        if not isinstance(rec, dict):
            raise FormatError(f"{path}, line {i + 1}: expected a JSON object")
        out.append(rec)
    return out


def _read_parquet(path: Path, columns: list[str] | None = None):
    pq = need("pyarrow.parquet")
    if not path.is_file():
        raise FormatError(f"{path} is missing (the dataset's metadata names it)")
    try:
        return pq.read_table(path, columns=columns)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError, KeyError, ...
        raise FormatError(
            f"{path} is not a readable parquet file with the columns LeRobot writes ({e})"
        ) from None


def _int(value: Any, what: str, where: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise FormatError(f"{where}: {what} must be an integer, got {value!r}")
    return int(value)


def _tasks_v30(root: Path) -> list[str]:
    path = root / V30_TASKS_PATH
    table = _read_parquet(path)
    meta = json.loads((table.schema.metadata or {}).get(b"pandas", b"{}") or "{}")
    index = [c for c in meta.get("index_columns", []) if isinstance(c, str)]
    name = "task" if "task" in table.column_names else (index[0] if index else None)
    if name is None or "task_index" not in table.column_names:
        raise FormatError(f"{path}: expected task strings and a task_index column")
    return _task_list(table.column(name).to_pylist(), table.column("task_index").to_pylist(), path)


def _task_list(strings: list, indices: list, where: Path) -> list[str]:
    out: list[str | None] = [None] * len(indices)
    for s, i in zip(strings, indices, strict=True):
        if not isinstance(s, str) or isinstance(i, bool) or not isinstance(i, int):
            raise FormatError(f"{where}: task {s!r} with task_index {i!r}")
        if not 0 <= i < len(out) or out[i] is not None:
            raise FormatError(f"{where}: task_index {i} is repeated or outside 0..{len(out) - 1}")
        out[i] = s
    return out  # type: ignore[return-value]


def _episodes_v30(root: Path, info: Info) -> list[Episode]:
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise FormatError(f"{root / 'meta' / 'episodes'} holds no episode parquet files")
    cols = ["episode_index", "tasks", "length", "data/chunk_index", "data/file_index"]
    cols += ["dataset_from_index", "dataset_to_index"]
    for key in info.videos:
        cols += [f"videos/{key}/{c}" for c in ("chunk_index", "file_index")]
        cols += [f"videos/{key}/{c}" for c in ("from_timestamp", "to_timestamp")]
    out = []
    for path in files:
        rows = _read_parquet(path, cols).to_pylist()
        for r in rows:
            e = _int(r["episode_index"], "episode_index", path)
            data = dataset_file(
                root,
                info.data_path,
                chunk_index=_int(r["data/chunk_index"], "data/chunk_index", path),
                file_index=_int(r["data/file_index"], "data/file_index", path),
            )
            span = (
                _int(r["dataset_from_index"], "dataset_from_index", path),
                _int(r["dataset_to_index"], "dataset_to_index", path),
            )
            ep = Episode(
                e, _int(r["length"], "length", path), _strings(r["tasks"], path), data, span
            )
            for key in info.videos:
                v = f"videos/{key}/"
                mp4 = dataset_file(
                    root,
                    info.video_path or "",
                    video_key=key,
                    chunk_index=_int(r[v + "chunk_index"], v + "chunk_index", path),
                    file_index=_int(r[v + "file_index"], v + "file_index", path),
                )
                t0, t1 = r[v + "from_timestamp"], r[v + "to_timestamp"]
                if not all(isinstance(t, (int, float)) for t in (t0, t1)) or not t0 <= t1:
                    raise FormatError(f"{path}: episode {e}: {key} spans {t0!r}..{t1!r} s")
                ep.videos[key] = (mp4, float(t0), float(t1))
            if span[1] - span[0] != ep.length:
                raise FormatError(
                    f"{path}: episode {e} has length {ep.length} but rows "
                    f"[{span[0]}, {span[1]}) of the dataset"
                )
            out.append(ep)
    return out


def _strings(value: Any, where: Path) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise FormatError(f"{where}: an episode's tasks must be a list of strings, got {value!r}")
    return value


def _episodes_v21(root: Path, info: Info) -> list[Episode]:
    where = root / V21_EPISODES_PATH
    out = []
    for r in _jsonl(where):
        e = _int(r.get("episode_index"), "episode_index", where)
        chunk = e // info.chunks_size
        fields = {"episode_chunk": chunk, "episode_index": e, "chunk_index": chunk}
        data = dataset_file(root, info.data_path, **fields)
        ep = Episode(
            e, _int(r.get("length"), "length", where), _strings(r.get("tasks"), where), data, None
        )
        for key in info.videos:
            mp4 = dataset_file(root, info.video_path or "", video_key=key, **fields)
            ep.videos[key] = (mp4, 0.0, float("inf"))
        out.append(ep)
    return out


def _tasks_v21(root: Path) -> list[str]:
    where = root / V21_TASKS_PATH
    recs = _jsonl(where)
    return _task_list([r.get("task") for r in recs], [r.get("task_index") for r in recs], where)


def plan(root: Path, info: Info) -> tuple[list[Episode], list[str]]:
    """The episodes in ``episode_index`` order and the task strings by ``task_index``,
    checked against ``info.json`` (counts, lengths, files present); ``FormatError``."""
    if info.version == V21:
        episodes, tasks = _episodes_v21(root, info), _tasks_v21(root)
    else:
        episodes, tasks = _episodes_v30(root, info), _tasks_v30(root)
    episodes.sort(key=lambda ep: ep.index)
    where = root / "meta"
    seen = [ep.index for ep in episodes]
    if len(set(seen)) != len(seen):
        raise FormatError(f"{where}: an episode_index appears twice in the episodes metadata")
    if len(episodes) != info.total_episodes:
        raise FormatError(
            f"{where}: info.json says {info.total_episodes} episodes, the episodes metadata "
            f"lists {len(episodes)}"
        )
    total = sum(ep.length for ep in episodes)
    if total != info.total_frames:
        raise FormatError(
            f"{where}: info.json says {info.total_frames} frames, the episodes' lengths add "
            f"up to {total}"
        )
    for ep in episodes:
        if ep.length < 1:
            raise FormatError(f"{where}: episode {ep.index} has length {ep.length}")
        for path in [ep.data, *(v[0] for v in ep.videos.values())]:
            if not path.is_file():
                raise FormatError(f"{path} is missing (episode {ep.index} is in it)")
    return episodes, tasks


# -- reading rows and frames ----------------------------------------------------------


def column_array(column, feat: Feature, n: int, where: str) -> np.ndarray:
    """A parquet column of ``n`` rows (scalars, fixed or nested lists) as a
    ``[n, *feat.shape]`` array of ``feat.dtype``; ``FormatError`` when it does not fit."""
    pa = need("pyarrow")
    arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if arr.null_count:
        raise FormatError(f"{where}: column {feat.name!r} has missing values")
    while (
        pa.types.is_list(arr.type)
        or pa.types.is_large_list(arr.type)
        or pa.types.is_fixed_size_list(arr.type)
    ):
        if arr.null_count:
            raise FormatError(f"{where}: column {feat.name!r} has missing values")
        arr = arr.flatten()
    values = arr.to_numpy(zero_copy_only=False)
    size = n * int(np.prod(feat.shape, dtype=np.int64))
    if (
        values.size != size
        or values.dtype.kind not in "biuf"
        # A dtype info.json declares that the values do not fit unchanged (float32 as
        # int64 or float16, ...): a lie to refuse, not a cast that loses data.
        or not np.can_cast(values.dtype, feat.dtype, casting="safe")
    ):
        raise FormatError(
            f"{where}: column {feat.name!r} holds {values.size} {values.dtype} values for "
            f"{n} rows; info.json declares {feat.dtype} {list(feat.shape)} per row"
        )
    return values.astype(feat.dtype, copy=False).reshape(n, *feat.shape)


def decode_image(data: Any, feat: Feature, where: str) -> np.ndarray:
    """One ``image`` cell (``{"bytes": PNG or JPEG, "path"}``) as uint8 ``[H, W, C]``."""
    av = need("av")
    raw = data.get("bytes") if isinstance(data, dict) else None
    if not isinstance(raw, bytes) or not raw:
        raise FormatError(f"{where}: an image of {feat.name!r} has no embedded bytes")
    codec = (
        "png" if raw[:8] == b"\x89PNG\r\n\x1a\n" else "mjpeg" if raw[:2] == b"\xff\xd8" else None
    )
    if codec is None:
        raise FormatError(f"{where}: an image of {feat.name!r} is neither PNG nor JPEG")
    if codec == "mjpeg":
        return _jpeg_array(raw, feat, where)
    try:
        ctx = av.CodecContext.create(codec, "r")
        frames = ctx.decode(av.Packet(raw))
        frames = frames or ctx.decode(None)
    except av.FFmpegError as e:
        raise FormatError(f"{where}: an image of {feat.name!r} does not decode ({e})") from None
    if not frames:
        raise FormatError(f"{where}: an image of {feat.name!r} does not decode")
    return _frame_array(frames[0], feat, where)


def _jpeg_array(raw: bytes, feat: Feature, where: str) -> np.ndarray:
    """A JPEG decoded by Pillow, as LeRobot's reader (``datasets``' ``Image``) decodes
    it: JPEG decoders differ in their IDCT and chroma upsampling (FFmpeg's by up to 3
    levels in most pixels of a colour frame), and the import gives LeRobot's pixels."""
    image = need("PIL.Image")
    try:
        with image.open(io.BytesIO(raw)) as im:
            img = np.asarray(im)
    except (OSError, ValueError) as e:  # UnidentifiedImageError is an OSError
        raise FormatError(f"{where}: an image of {feat.name!r} does not decode ({e})") from None
    if img.ndim == 2:
        img = img[:, :, None]
    if img.dtype != np.uint8 or img.shape != feat.shape:
        raise FormatError(
            f"{where}: a JPEG frame of {feat.name!r} is {img.dtype} {list(img.shape)}; "
            f"info.json declares uint8 {list(feat.shape)}"
        )
    return img


def _frame_array(frame, feat: Feature, where: str) -> np.ndarray:
    img = frame.to_ndarray(format=PIX_FMT[feat.shape[2]])
    if img.ndim == 2:
        img = img[:, :, None]
    if img.shape != feat.shape:
        raise FormatError(
            f"{where}: a frame of {feat.name!r} is {list(img.shape)}; info.json declares "
            f"{list(feat.shape)}"
        )
    return img


class VideoFile:
    """One mp4 decoded front to back, handing out the frames of consecutive time spans."""

    def __init__(self, path: Path):
        av = need("av")
        self.path = path
        try:
            self.container = av.open(str(path))
            self.stream = self.container.streams.video[0]
        except (av.FFmpegError, IndexError) as e:
            self.close()
            raise FormatError(f"{path} is not a readable video ({e})") from None
        self.stream.thread_type = "AUTO"
        self.frames = self.container.decode(self.stream)
        self.ahead = None  # a decoded frame past the last span handed out
        self.position = 0.0  # where the last span ended

    def close(self) -> None:
        container = getattr(self, "container", None)
        if container is not None:
            container.close()

    def between(self, start: float, stop: float, tol: float) -> Iterator:
        """The frames whose time lies in ``[start - tol, stop - tol)``, in order, decoded
        as they are asked for."""
        av = need("av")
        while True:
            frame, self.ahead = self.ahead, None
            if frame is None:
                try:
                    frame = next(self.frames, None)
                except av.FFmpegError as e:
                    raise FormatError(f"{self.path} does not decode ({e})") from None
                if frame is None:
                    break
            t = frame.time
            if t is None:
                raise FormatError(f"{self.path}: a frame has no timestamp")
            if t >= stop - tol:
                self.ahead = frame
                break
            if t >= start - tol:
                yield frame
        self.position = stop


class Videos:
    """The open mp4 of each video key, reopened when an episode is in another file or
    earlier in the same one (LeRobot writes them in order, so each is decoded once)."""

    def __init__(self, tol: float):
        self.tol = tol
        self.open: dict[str, VideoFile] = {}
        self.decoded = 0

    def close(self) -> None:
        for v in self.open.values():
            v.close()
        self.open.clear()

    def frames(self, feat: Feature, ep: Episode, timestamps: np.ndarray) -> np.ndarray:
        """Episode ``ep``'s frames of ``feat``, one per row: uint8 ``[L, H, W, C]``."""
        path, t0, t1 = ep.videos[feat.name]
        v = self.open.get(feat.name)
        if v is None or v.path != path or t0 < v.position - self.tol:
            if v is not None:
                v.close()
            v = self.open[feat.name] = VideoFile(path)
        got = (v.stream.codec_context.height, v.stream.codec_context.width)
        if got != tuple(feat.shape[:2]):  # before allocating what info.json claims
            raise FormatError(
                f"{path}: its frames of {feat.name!r} are {got[0]}x{got[1]}; info.json "
                f"declares {list(feat.shape)}"
            )
        # Converted one by one into the episode's array: one episode's frames in memory.
        out = np.empty((ep.length, *feat.shape), np.uint8)
        times, where = [], f"{path} (episode {ep.index})"
        for i, frame in enumerate(v.between(t0, t1, self.tol)):
            if i < ep.length:
                out[i] = _frame_array(frame, feat, where)
            times.append(frame.time)
        if len(times) != ep.length:
            span = f"from {t0} s" + ("" if t1 == float("inf") else f" to {t1} s")
            raise FormatError(
                f"{path}: episode {ep.index} has {len(times)} frames of {feat.name!r} {span}, "
                f"but its length is {ep.length}; the video and the episode metadata disagree "
                "(a truncated or re-encoded video?)"
            )
        times = np.asarray(times)
        off = np.abs(times - (t0 + timestamps.astype(np.float64)))
        if off.max() > self.tol:
            i = int(off.argmax())
            raise FormatError(
                f"{path}: episode {ep.index}, frame {i} of {feat.name!r} is at "
                f"{times[i]:.6f} s but its row's timestamp asks for {t0 + timestamps[i]:.6f} s "
                f"(tolerance {self.tol} s)"
            )
        self.decoded += ep.length
        return out


def _episode_rows(table, ep: Episode, where: Path, ep_col: np.ndarray):
    """The rows of episode ``ep`` in the data file's ``table``: one contiguous run of
    exactly ``ep.length`` rows (LeRobot never splits an episode across files)."""
    idx = np.flatnonzero(ep_col == ep.index)
    if len(idx) != ep.length:
        raise FormatError(
            f"{where} holds {len(idx)} rows of episode {ep.index}, whose length is "
            f"{ep.length}; LeRobot writes each episode whole into one data file (the dataset "
            "is damaged, or was merged by hand)"
        )
    if idx[-1] - idx[0] + 1 != len(idx):
        raise FormatError(f"{where}: the rows of episode {ep.index} are not contiguous")
    return table.slice(int(idx[0]), len(idx))


def iter_episodes(
    root: Path, info: Info, episodes: list[Episode], videos: Videos
) -> Iterator[dict[str, np.ndarray]]:
    """Each episode's columns by LeRobot feature name, ``[L, ...]`` arrays, in order
    (``videos`` decodes the frames; the caller closes it)."""
    names = list(info.features)
    stored = [n for n in names if info.features[n].kind != VIDEO]
    table = path = ep_col = None
    for ep in episodes:
        if ep.data != path:
            table = None  # one data file in memory at a time
            path = ep.data
            table = _read_parquet(path)
            missing = [n for n in stored if n not in table.column_names]
            if missing:
                raise FormatError(f"{path} lacks the columns {missing} info.json declares")
            ep_col = column_array(
                table.column("episode_index"),
                info.features["episode_index"],
                table.num_rows,
                str(path),
            ).reshape(-1)
        rows = _episode_rows(table, ep, path, ep_col)
        where = f"{path} (episode {ep.index})"
        cols: dict[str, np.ndarray] = {}
        for n in stored:
            feat = info.features[n]
            if feat.kind == IMAGE:
                cells = rows.column(n).to_pylist()
                cols[n] = np.stack([decode_image(c, feat, where) for c in cells])
            else:
                cols[n] = column_array(rows.column(n), feat, ep.length, where)
        if ep.rows is not None:
            index = cols["index"].reshape(-1)
            if index[0] != ep.rows[0] or index[-1] != ep.rows[1] - 1:
                raise FormatError(
                    f"{where}: rows with index {index[0]}..{index[-1]}, the episodes "
                    f"metadata says [{ep.rows[0]}, {ep.rows[1]})"
                )
        ts = cols["timestamp"].reshape(ep.length, -1)[:, 0]
        for n in info.videos:
            cols[n] = videos.frames(info.features[n], ep, ts)
        yield {n: cols[n] for n in names}
