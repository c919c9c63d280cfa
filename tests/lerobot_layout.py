"""LeRobot dataset directories written by hand with pyarrow and PyAV (no LeRobot), as the
v3.0 and v2.1 layouts are documented (src/zreplay/compat/lerobot_format.py), for the
quick tests of ``import_lerobot``: good ones, and damaged ones LeRobot's writer would
never make (an episode split across data files, an mp4 shorter than its episodes).

:func:`write_dataset` returns what it wrote: the rows of every non-video feature,
stacked in ``index`` order (images as uint8 ``[H, W, C]``), and the mp4 files.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FPS = 10
FRONT = "observation.images.front"  # a video camera
WRIST = "observation.images.wrist"  # an image camera (PNG in the parquet)
FRONT_SHAPE, WRIST_SHAPE = (16, 24, 3), (8, 12, 3)
TASKS = ["pick", "place"]


def frame(e: int, t: int, shape: tuple[int, ...]) -> np.ndarray:
    """A smooth test picture that differs per episode and step."""
    h, w, c = shape
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 9 + t * 20) % 256, (y * 13 + e * 50) % 256, (x + y) * 4 % 256], -1)
    return img[..., :c].astype(np.uint8)


def png(img: np.ndarray) -> bytes:
    ctx = av.CodecContext.create("png", "w")
    ctx.width, ctx.height, ctx.pix_fmt = img.shape[1], img.shape[0], "rgb24"
    packets = ctx.encode(av.VideoFrame.from_ndarray(img, format="rgb24")) + ctx.encode(None)
    return b"".join(bytes(p) for p in packets)


def encode_mp4(path: Path, frames: list[np.ndarray]) -> None:
    """``frames`` at ``FPS``, back to back from t=0 (mpeg4: quick, and in PyAV's wheel)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as out:
        s = out.add_stream("mpeg4", rate=FPS)
        s.width, s.height, s.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        s.time_base = Fraction(1, FPS)
        for i, img in enumerate(frames):
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts, f.time_base = i, Fraction(1, FPS)
            out.mux(s.encode(f))
        out.mux(s.encode(None))


def decode_mp4(path: Path) -> np.ndarray:
    """Every frame of ``path`` as PyAV decodes it (uint8 ``[N, H, W, 3]``)."""
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])])


def features(video: bool = True, image: bool = True) -> dict:
    hwc = ["height", "width", "channels"]
    out = {}
    if video:
        info = {"video.codec": "mpeg4", "video.pix_fmt": "yuv420p", "video.is_depth_map": False}
        info |= {"video.fps": FPS, "has_audio": False}
        out[FRONT] = {"dtype": "video", "shape": list(FRONT_SHAPE), "names": hwc, "info": info}
    if image:
        out[WRIST] = {"dtype": "image", "shape": list(WRIST_SHAPE), "names": hwc}
    out |= {
        "observation.state": {"dtype": "float32", "shape": [3], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    }
    for name in ("frame_index", "episode_index", "index", "task_index"):
        out[name] = {"dtype": "int64", "shape": [1], "names": None}
    return out


def rows(lengths: list[int], image: bool = True) -> dict[str, np.ndarray]:
    """Every non-video feature's rows, episodes back to back."""
    e = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)]).astype(np.int64)
    t = np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)
    last = np.concatenate([np.arange(n) == n - 1 for n in lengths])
    out = {
        "observation.state": (e[:, None] * 100 + t[:, None] + [0, 0.1, 0.2]).astype(np.float32),
        "action": np.stack([e, -t], 1).astype(np.float32),
        "next.reward": (t * 0.5).astype(np.float32),
        "next.done": last & (e % 2 == 0),  # odd episodes are cut short: truncated
        "timestamp": (t / FPS).astype(np.float32),
        "frame_index": t,
        "episode_index": e,
        "index": np.arange(len(e), dtype=np.int64),
        "task_index": e % len(TASKS),
    }
    if image:
        out[WRIST] = np.stack([frame(i, j, WRIST_SHAPE) for i, j in zip(e, t, strict=True)])
    return out


def _table(cols: dict[str, np.ndarray], sel: np.ndarray) -> pa.Table:
    out = {}
    for k, v in cols.items():
        v = v[sel]
        if k == WRIST:
            out[k] = pa.array([{"bytes": png(img), "path": None} for img in v])
        elif v.ndim == 2:
            out[k] = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1])
        elif v.ndim > 2:  # HF's Array2D..5D: nested lists
            out[k] = pa.array(v.tolist())
        else:
            out[k] = pa.array(v)
    return pa.table(out)


def write_dataset(
    root: Path,
    version: str = "v3.0",
    lengths: tuple[int, ...] = (5, 7, 6),
    data_files: list[list[int]] | None = None,
    video_files: list[list[int]] | None = None,
    *,
    video: bool = True,
    image: bool = True,
    short_video: dict[int, int] | None = None,
    split_episode: int | None = None,
    extra_features: dict | None = None,
    extra_columns: dict[str, np.ndarray] | None = None,
    info_changes: dict | None = None,
) -> dict[str, np.ndarray]:
    """Write a LeRobot dataset of ``version`` with episodes of ``lengths`` to ``root``.

    v3.0: ``data_files``/``video_files`` group the episodes into files (default: one of
    each), numbered chunk 0, files 0, 1, ...; ``split_episode``: that episode's second
    half goes into the next data file while the metadata says the first;
    ``short_video={e: k}``: episode ``e`` gets ``k`` fewer frames in its mp4 than its
    length.  ``extra_features``/``info_changes`` are merged into info.json as written,
    ``extra_columns`` (one row per frame) into the data files.
    Returns the rows of the non-video features (see :func:`rows`)."""
    root = Path(root)
    lengths = list(lengths)
    n_ep = len(lengths)
    cols = rows(lengths, image) | dict(extra_columns or {})
    short = short_video or {}
    feats = features(video, image) | dict(extra_features or {})
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    ep_of_row = cols["episode_index"]
    (root / "meta").mkdir(parents=True)
    info = {
        "codebase_version": version,
        "robot_type": None,
        "total_episodes": n_ep,
        "total_frames": int(bounds[-1]),
        "total_tasks": len(TASKS),
        "chunks_size": 1000,
        "fps": FPS,
        "splits": {"train": f"0:{n_ep}"},
        "features": feats,
    }

    def episode_frames(e: int) -> list[np.ndarray]:
        return [frame(e, t, FRONT_SHAPE) for t in range(lengths[e] - short.get(e, 0))]

    if version == "v2.1":
        info |= {
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": (
                "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
                if video
                else None
            ),
            "total_chunks": 1,
            "total_videos": n_ep if video else 0,
        }
        for e in range(n_ep):
            path = root / f"data/chunk-000/episode_{e:06d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(_table(cols, ep_of_row == e), path)
            if video:
                encode_mp4(
                    root / f"videos/chunk-000/{FRONT}/episode_{e:06d}.mp4", episode_frames(e)
                )
        lines = [
            {"episode_index": e, "tasks": [TASKS[e % 2]], "length": n}
            for e, n in enumerate(lengths)
        ]
        (root / "meta/episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        tasks = [{"task_index": i, "task": t} for i, t in enumerate(TASKS)]
        (root / "meta/tasks.jsonl").write_text("".join(json.dumps(x) + "\n" for x in tasks))
    else:
        info |= {
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": (
                "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
                if video
                else None
            ),
        }
        data_files = data_files or [list(range(n_ep))]
        video_files = video_files or [list(range(n_ep))]
        meta = {k: [] for k in ("episode_index", "tasks", "length", "data/chunk_index")}
        meta |= {k: [] for k in ("data/file_index", "dataset_from_index", "dataset_to_index")}
        where = {}
        for f, eps in enumerate(data_files):
            sel = np.isin(ep_of_row, eps)
            if split_episode is not None and split_episode in eps:
                half = np.flatnonzero(ep_of_row == split_episode)[lengths[split_episode] // 2 :]
                sel[half] = False
            if split_episode is not None and f > 0 and split_episode in data_files[f - 1]:
                sel[np.flatnonzero(ep_of_row == split_episode)[lengths[split_episode] // 2 :]] = (
                    True
                )
            path = root / f"data/chunk-000/file-{f:03d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(_table(cols, sel), path)
            for e in eps:
                where[e] = f
        vmeta = {}
        for f, eps in enumerate(video_files if video else []):
            t = 0.0
            clip = []
            for e in eps:
                got = episode_frames(e)
                clip += got
                vmeta[e] = (f, t, t + len(got) / FPS)
                t += len(got) / FPS
            encode_mp4(root / f"videos/{FRONT}/chunk-000/file-{f:03d}.mp4", clip)
        for e, n in enumerate(lengths):
            meta["episode_index"].append(e)
            meta["tasks"].append([TASKS[e % 2]])
            meta["length"].append(n)
            meta["data/chunk_index"].append(0)
            meta["data/file_index"].append(where[e])
            meta["dataset_from_index"].append(int(bounds[e]))
            meta["dataset_to_index"].append(int(bounds[e + 1]))
            if video:
                f, t0, t1 = vmeta[e]
                for k, v in (("chunk_index", 0), ("file_index", f)):
                    meta.setdefault(f"videos/{FRONT}/{k}", []).append(v)
                for k, v in (("from_timestamp", t0), ("to_timestamp", t1)):
                    meta.setdefault(f"videos/{FRONT}/{k}", []).append(v)
        path = root / "meta/episodes/chunk-000/file-000.parquet"
        path.parent.mkdir(parents=True)
        pq.write_table(pa.table(meta), path)
        # pandas' layout, as LeRobot writes it: the task strings are the frame's index.
        tasks = pa.table({"task_index": list(range(len(TASKS))), "__index_level_0__": TASKS})
        pandas = {"index_columns": ["__index_level_0__"], "columns": []}
        tasks = tasks.replace_schema_metadata({b"pandas": json.dumps(pandas).encode()})
        pq.write_table(tasks, root / "meta/tasks.parquet")
    (root / "meta/stats.json").write_text("{}")
    info |= dict(info_changes or {})
    (root / "meta/info.json").write_text(json.dumps(info, indent=2))
    return cols
