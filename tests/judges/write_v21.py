"""Judge script: rewrite a LeRobot v3.0 dataset directory in the v2.1 layout, which LeRobot
0.4.4 reads (through its converter) but no longer writes.

    write_v21.py SRC_V30 DST_V21 [VCODEC]

(VCODEC: libsvtav1 by default, as LeRobot; SVT-AV1 refuses frames under 64 pixels, so
tiny hand-written layouts pass mpeg4.)

One parquet per episode (``data/chunk-XXX/episode_EEEEEE.parquet``, the rows as they are,
schema metadata kept), one mp4 per episode (``videos/chunk-XXX/<key>/episode_EEEEEE.mp4``:
the episode's frames decoded from the v3.0 file and encoded again as LeRobot encodes, AV1
yuv420p g=2 crf=30, from t=0), ``meta/episodes.jsonl``, ``meta/episodes_stats.jsonl``,
``meta/tasks.jsonl``, info.json with v2.1's templates and counts.  Needs pyarrow and PyAV
only (it runs in the judge venv or the project's).
"""

import json
import shutil
import sys
from fractions import Fraction
from pathlib import Path

import av
import pyarrow.compute as pc
import pyarrow.parquet as pq

DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
TOL = 1e-4


def episodes(src: Path) -> list[dict]:
    rows = []
    for p in sorted((src / "meta/episodes").glob("*/*.parquet")):
        rows += pq.read_table(p).to_pylist()
    return sorted(rows, key=lambda r: r["episode_index"])


def tasks(src: Path) -> list[dict]:
    t = pq.read_table(src / "meta/tasks.parquet")
    meta = json.loads((t.schema.metadata or {}).get(b"pandas", b"{}"))
    name = "task" if "task" in t.column_names else meta["index_columns"][0]
    pairs = zip(t.column("task_index").to_pylist(), t.column(name).to_pylist(), strict=True)
    return [{"task_index": i, "task": s} for i, s in sorted(pairs)]


def clip(path: Path, t0: float, t1: float) -> list:
    with av.open(str(path)) as c:
        return [
            f.to_ndarray(format="rgb24")
            for f in c.decode(c.streams.video[0])
            if t0 - TOL <= f.time < t1 - TOL
        ]


def encode(path: Path, frames: list, fps: int, codec: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as out:
        opts = {"g": "2", "crf": "30", "preset": "12"} if codec == "libsvtav1" else {}
        s = out.add_stream(codec, rate=fps, options=opts)
        s.width, s.height, s.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        for i, img in enumerate(frames):
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts, f.time_base = i, Fraction(1, fps)
            out.mux(s.encode(f))
        out.mux(s.encode(None))


def main() -> None:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    codec = sys.argv[3] if len(sys.argv) > 3 else "libsvtav1"
    info = json.loads((src / "meta/info.json").read_text())
    videos = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    size = info["chunks_size"]
    eps = episodes(src)
    (dst / "meta").mkdir(parents=True)
    loaded = (None, None)
    for ep in eps:
        e = ep["episode_index"]
        fields = {"episode_chunk": e // size, "episode_index": e}
        path = src / info["data_path"].format(
            chunk_index=ep["data/chunk_index"], file_index=ep["data/file_index"]
        )
        if loaded[0] != path:
            loaded = (path, pq.read_table(path))
        part = loaded[1].filter(pc.equal(loaded[1]["episode_index"], e))
        out = dst / DATA.format(**fields)
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(part, out)
        for key in videos:
            v = f"videos/{key}/"
            mp4 = src / info["video_path"].format(
                video_key=key, chunk_index=ep[v + "chunk_index"], file_index=ep[v + "file_index"]
            )
            frames = clip(mp4, ep[v + "from_timestamp"], ep[v + "to_timestamp"])
            encode(dst / VIDEO.format(video_key=key, **fields), frames, info["fps"], codec)
    with open(dst / "meta/episodes.jsonl", "w") as f:
        for ep in eps:
            rec = {k: ep[k] for k in ("episode_index", "tasks", "length")}
            f.write(json.dumps(rec) + "\n")
    with open(dst / "meta/episodes_stats.jsonl", "w") as f:
        for ep in eps:
            stats: dict = {}
            for k, v in ep.items():
                if k.startswith("stats/"):
                    feat, stat = k[len("stats/") :].rsplit("/", 1)
                    stats.setdefault(feat, {})[stat] = v
            f.write(json.dumps({"episode_index": ep["episode_index"], "stats": stats}) + "\n")
    with open(dst / "meta/tasks.jsonl", "w") as f:
        for t in tasks(src):
            f.write(json.dumps(t) + "\n")
    for k in ("data_files_size_in_mb", "video_files_size_in_mb"):
        info.pop(k, None)
    info.update(
        codebase_version="v2.1",
        data_path=DATA,
        video_path=VIDEO if videos else None,
        total_chunks=(len(eps) + size - 1) // size,
        total_videos=len(eps) * len(videos),
    )
    (dst / "meta/info.json").write_text(json.dumps(info, indent=4))
    if (src / "meta/stats.json").exists():
        shutil.copy(src / "meta/stats.json", dst / "meta/stats.json")
    print(f"wrote {len(eps)} episodes in the v2.1 layout to {dst}")


if __name__ == "__main__":
    main()
