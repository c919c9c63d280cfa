"""LeRobot's dataset layouts (codebase versions v3.0 and v2.1) as both directions need
them: ``meta/info.json``, path templates, feature kinds and dtypes, the columns LeRobot
adds to every dataset, and the key names rewards and episode ends are stored under.

v3.0 (LeRobot >= 0.4)::

    meta/info.json                          codebase_version, fps, features, data_path, video_path, ...
    meta/episodes/chunk-XXX/file-YYY.parquet  one row per episode: episode_index, tasks, length,
                                            data/{chunk,file}_index, dataset_{from,to}_index,
                                            videos/<key>/{chunk_index,file_index,from_timestamp,to_timestamp}
    meta/tasks.parquet                      task strings (the pandas index) -> task_index
    meta/stats.json
    data/chunk-XXX/file-YYY.parquet         the rows of many episodes, in ``index`` order
    videos/<key>/chunk-XXX/file-YYY.mp4     many episodes, episode e in [from_timestamp, to_timestamp)

v2.1 (LeRobot < 0.4): one ``data/chunk-XXX/episode_EEEEEE.parquet`` and one
``videos/chunk-XXX/<key>/episode_EEEEEE.mp4`` per episode (each video from t=0),
``meta/episodes.jsonl`` {episode_index, tasks, length} and ``meta/tasks.jsonl``
{task_index, task}.

The reader (:mod:`.lerobot_read`) and the writer (:mod:`.lerobot_files`,
:mod:`.lerobot_export`) both take these facts from here.  Nothing here imports LeRobot;
pyarrow, PyAV and Pillow are imported when first needed (:func:`need`).  A dataset
directory is untrusted data, so every file a template names must stay inside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError
from ..schema import check_key_component
from ..threads import import_whole

V30, V21 = "v3.0", "v2.1"
VERSIONS = (V30, V21)
INFO = "meta/info.json"

# What LeRobot writes by default (0.4.4, lerobot/datasets/utils.py).
V30_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V30_EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_TASKS_PATH = "meta/tasks.parquet"
V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
V21_EPISODES_PATH = "meta/episodes.jsonl"
V21_TASKS_PATH = "meta/tasks.jsonl"
STATS_PATH = "meta/stats.json"
DEFAULT_CHUNKS_SIZE = 1000
DEFAULT_DATA_FILE_MB = 100
DEFAULT_VIDEO_FILE_MB = 200

# Columns LeRobot adds to every dataset, in its order, with their dtypes (all shape (1,)).
DEFAULT_DTYPES = {
    "timestamp": "float32",
    "frame_index": "int64",
    "episode_index": "int64",
    "index": "int64",
    "task_index": "int64",
}
DEFAULT_FEATURES = tuple(DEFAULT_DTYPES)
# LeRobot's reward and done features, and the buffer keys they are stored under (the
# names zreplay's conventions know: n-step returns, episode ends).
REWARD, DONE = "next.reward", "next.done"
REWARDS_KEY, TERMINATED_KEY, TRUNCATED_KEY = "rewards", "terminated", "truncated"

VIDEO, IMAGE, ARRAY = "video", "image", "array"
IMAGE_MODES = (VIDEO, IMAGE)  # how a camera is stored; export_lerobot's ``images=``
FRAME_NAMES = ["height", "width", "channels"]
# A video's stream as LeRobot 0.4.4 encodes it by default (LeRobotDataset.create,
# video_utils._get_codec_options), and the ``info`` it probes from it.
VIDEO_CODEC = "libsvtav1"
VIDEO_PIX_FMT = "yuv420p"
VIDEO_OPTIONS = {"g": "2", "crf": "30", "preset": "12"}
# numpy dtype strings LeRobot features may declare for plain arrays.
ARRAY_DTYPES = frozenset(
    ["bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"]
    + ["float16", "float32", "float64"]
)


def need(module: str):
    """``module`` imported (Ctrl-C safe), or ImportError naming the extra that has it."""
    try:
        return import_whole(module)
    except ImportError:
        raise ImportError(
            f"LeRobot import and export need {module!r}: pip install 'zreplay[lerobot]' "
            "(pyarrow, PyAV and Pillow)"
        ) from None


@dataclass(frozen=True)
class Feature:
    """One LeRobot feature: its verbatim ``name``, ``kind`` (``"video"``, ``"image"``
    or ``"array"``), numpy ``dtype`` (uint8 for frames) and per-frame ``shape``
    (``[H, W, C]`` for frames); in an export, the buffer ``key`` it comes from (None
    for LeRobot's own columns)."""

    name: str
    kind: str
    dtype: np.dtype
    shape: tuple[int, ...]
    key: str | None = None

    @property
    def is_frame(self) -> bool:
        return self.kind in IMAGE_MODES

    @property
    def declared(self) -> str:
        """The ``dtype`` info.json lists: ``"video"``, ``"image"`` or a numpy name."""
        return self.kind if self.is_frame else self.dtype.name

    def info(self, fps: int) -> dict:
        """The feature as ``info.json`` lists it (a video's stream info too, as LeRobot
        probes it from the files it encodes)."""
        names = FRAME_NAMES if self.is_frame else None
        out: dict[str, Any] = {"dtype": self.declared, "shape": list(self.shape), "names": names}
        if self.kind == VIDEO:
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


def default_features() -> list[Feature]:
    """LeRobot's own columns as features, in its order."""
    return [Feature(n, ARRAY, np.dtype(d), (1,)) for n, d in DEFAULT_DTYPES.items()]


def feature(name: Any, spec: Any) -> Feature:
    """``info.json``'s ``features[name]`` as a :class:`Feature`; ``FormatError`` for what
    cannot be stored as rows (depth maps, audio, strings, unknown dtypes), ``KeyNameError``
    for a name that is not safe as a buffer key."""
    check_key_component(name)
    if not isinstance(spec, dict):
        raise FormatError(f"feature {name!r}: expected an object in info.json, got {spec!r}")
    dtype, shape = spec.get("dtype"), spec.get("shape")
    if not isinstance(shape, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise FormatError(f"feature {name!r}: shape must be a list of sizes, got {shape!r}")
    shape = tuple(shape)
    info = spec.get("info") or {}
    if dtype == "audio" or (isinstance(info, dict) and info.get("has_audio")):
        raise FormatError(
            f"feature {name!r} holds audio, which zreplay does not import; drop the feature "
            "from the dataset (or its audio track) first"
        )
    if dtype in (VIDEO, IMAGE):
        if isinstance(info, dict) and (info.get("video.is_depth_map") or info.get("is_depth_map")):
            raise FormatError(
                f"feature {name!r} is a depth map, which zreplay does not import (its frames "
                "are not uint8 RGB); drop the feature from the dataset first"
            )
        if len(shape) != 3 or shape[2] not in (1, 3, 4):
            raise FormatError(
                f"feature {name!r} ({dtype}): expected shape [height, width, channels] with "
                f"1, 3 or 4 channels, got {list(shape)}"
            )
        return Feature(name, dtype, np.dtype(np.uint8), shape)
    if dtype not in ARRAY_DTYPES:
        raise FormatError(
            f"feature {name!r} has dtype {dtype!r}, which zreplay does not import; it "
            f"imports {sorted(ARRAY_DTYPES)}, 'image' and 'video'"
        )
    return Feature(name, ARRAY, np.dtype(dtype), shape)


@dataclass(frozen=True)
class Info:
    """What ``meta/info.json`` says, checked: ``version`` (``"v3.0"`` or ``"v2.1"``),
    ``fps``, ``features`` (in the file's order), path templates, ``chunks_size`` and the
    whole parsed file (``raw``)."""

    version: str
    fps: float
    features: dict[str, Feature]
    data_path: str
    video_path: str | None
    chunks_size: int
    total_episodes: int
    total_frames: int
    robot_type: str | None
    raw: dict

    @property
    def videos(self) -> list[str]:
        return [k for k, f in self.features.items() if f.kind == VIDEO]


def codebase_version(root: Path) -> str | None:
    """``"v3.0"``, ``"v2.1"`` (or another version string) of a LeRobot dataset directory,
    None when ``root`` has no readable ``meta/info.json``."""
    try:
        raw = json.loads((Path(root) / INFO).read_text())
    except (OSError, ValueError):
        return None
    v = raw.get("codebase_version") if isinstance(raw, dict) else None
    return v if isinstance(v, str) else None


def is_lerobot_dir(root) -> bool:
    """Whether ``root`` is a local LeRobot dataset directory (``meta/info.json``), of any
    version: :func:`read_info` says which ones zreplay reads."""
    return (Path(root) / INFO).is_file()


def read_info(root: Path) -> Info:
    """``root/meta/info.json`` checked; ``FormatError`` naming what is wrong."""
    path = Path(root) / INFO
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(f"{path} is missing; {root} is not a LeRobot dataset") from None
    except (OSError, ValueError) as e:
        raise FormatError(f"{path} is not readable JSON ({e})") from None
    if not isinstance(raw, dict):
        raise FormatError(f"{path}: expected a JSON object")
    version = raw.get("codebase_version")
    if version not in VERSIONS:
        raise FormatError(
            f"{root} is a LeRobot dataset of codebase version {version!r}; zreplay reads "
            f"{' and '.join(VERSIONS)} (convert older ones with LeRobot's own converters)"
        )
    feats = raw.get("features")
    if not isinstance(feats, dict) or not feats:
        raise FormatError(f"{path}: 'features' must be a non-empty object")
    features = {name: feature(name, spec) for name, spec in feats.items()}
    for name in DEFAULT_FEATURES:
        if name not in features:
            raise FormatError(f"{path}: LeRobot's column {name!r} is not among the features")
    fps = raw.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0:
        raise FormatError(f"{path}: fps must be a positive number, got {fps!r}")
    default_data = V30_DATA_PATH if version == V30 else V21_DATA_PATH
    data_path = raw.get("data_path") or default_data
    video_path = raw.get("video_path")
    if any(f.kind == VIDEO for f in features.values()) and not video_path:
        video_path = V30_VIDEO_PATH if version == V30 else V21_VIDEO_PATH
    return Info(
        version=version,
        fps=float(fps),
        features=features,
        data_path=_template(data_path, path, "data_path"),
        video_path=None if video_path is None else _template(video_path, path, "video_path"),
        chunks_size=_count(raw.get("chunks_size", DEFAULT_CHUNKS_SIZE), path, "chunks_size", 1),
        total_episodes=_count(raw.get("total_episodes", 0), path, "total_episodes", 0),
        total_frames=_count(raw.get("total_frames", 0), path, "total_frames", 0),
        robot_type=raw.get("robot_type") if isinstance(raw.get("robot_type"), str) else None,
        raw=raw,
    )


def _template(value: Any, where: Path, name: str) -> str:
    if not isinstance(value, str):
        raise FormatError(f"{where}: {name} must be a string, got {value!r}")
    return value


def _count(value: Any, where: Path, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise FormatError(f"{where}: {name} must be an integer >= {low}, got {value!r}")
    return value


def dataset_file(root: Path, template: str, **fields: Any) -> Path:
    """The file ``template`` (a ``data_path``/``video_path`` of info.json) names for
    ``fields``, under ``root``; ``FormatError`` when the template does not fit the fields
    or leads out of ``root`` (a dataset directory is untrusted data)."""
    try:
        rel = template.format(**fields)
    except (KeyError, IndexError, ValueError) as e:
        raise FormatError(
            f"{root / INFO}: path template {template!r} cannot be filled with "
            f"{sorted(fields)} ({e!r})"
        ) from None
    parts = Path(rel).parts
    if Path(rel).is_absolute() or ".." in parts or not parts:
        raise FormatError(f"{root / INFO}: path template {template!r} leads out of {root}")
    return Path(root) / rel
