"""LeRobot import and random access: zreplay against LeRobot 0.4.4's own reader.

Runs in the LeRobot judge venv (``.ci/lerobot-env DIR``; LeRobot's code needs it), with
this checkout's ``src`` and the test-only torchvision stand-in on the path::

    HF_HUB_OFFLINE=1 PYTHONPATH=src:tests/judges DIR/bin/python benchmarks/bench_lerobot.py [--quick]

It writes a dataset with LeRobot's writer (an AV1 video camera of panned photo crops, a
PNG image camera, state, action, reward, done; files rolling over) and measures:

* import throughput: ``zreplay.import_lerobot`` (every frame decoded once, written to a
  buffer) in frames/s, against LeRobot's reader decoding the same dataset item by item
  (``LeRobotDataset(root, video_backend="pyav")[i]`` for every ``i``);
* random access: ``zreplay.open(buffer).sample(256)`` against 256 random
  ``LeRobotDataset[i]`` (the issue's target: at most 0.05x).

Prints a table and writes JSON (``--out``; default benchmarks/results/latest/lerobot.json).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchlib  # noqa: E402


def make_dataset(root: Path, episodes: int, length: int, size: int) -> int:
    import skimage.data
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    hwc = ["height", "width", "channels"]
    features = {
        "observation.images.front": {"dtype": "video", "shape": (size, size, 3), "names": hwc},
        "observation.images.wrist": {"dtype": "image", "shape": (size, size, 3), "names": hwc},
        "observation.state": {"dtype": "float32", "shape": (14,), "names": None},
        "action": {"dtype": "float32", "shape": (7,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
    }
    photo = skimage.data.astronaut()
    rng = np.random.default_rng(0)
    ds = LeRobotDataset.create("zreplay/bench", fps=30, features=features, root=root)
    ds.meta.update_chunk_settings(data_files_size_in_mb=4, video_files_size_in_mb=4)
    span = photo.shape[0] - size
    for e in range(episodes):
        for t in range(length):
            y, x = (e * 7 + t) % span, (e * 13 + 2 * t) % span
            ds.add_frame(
                {
                    "observation.images.front": photo[y : y + size, x : x + size],
                    "observation.images.wrist": photo[x : x + size, y : y + size],
                    "observation.state": rng.standard_normal(14).astype(np.float32),
                    "action": rng.uniform(-1, 1, 7).astype(np.float32),
                    "next.reward": np.array([t / length], np.float32),
                    "next.done": np.array([t == length - 1]),
                    "task": "bench",
                }
            )
        ds.save_episode()
    ds.finalize()
    return episodes * length


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--length", type=int, default=100)
    ap.add_argument("--size", type=int, default=96, help="camera frames are size x size x 3")
    ap.add_argument("--quick", action="store_true", help="4 episodes of 50 frames")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "latest" / "lerobot.json")
    a = ap.parse_args(argv)
    if a.quick:
        a.episodes, a.length = 4, 50

    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    import zreplay

    work = Path(tempfile.mkdtemp(prefix="zreplay-bench-lerobot-"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        src = work / "dataset"
        n = make_dataset(src, a.episodes, a.length, a.size)

        imports = []
        for i in range(2):
            t0 = time.perf_counter()
            zreplay.import_lerobot(src, work / f"buffer{i}")
            imports.append(time.perf_counter() - t0)
        ds = LeRobotDataset("zreplay/bench", root=src, video_backend="pyav")
        t0 = time.perf_counter()
        for i in range(len(ds)):
            ds[i]
        lerobot_all = time.perf_counter() - t0

        view = zreplay.open(work / "buffer0")
        zr_sample = benchlib.repeat(lambda: view.sample(256), repeats=20)
        rng = np.random.default_rng(1)
        lr_sample = benchlib.repeat(
            lambda: [ds[int(i)] for i in rng.integers(0, len(ds), 256)], repeats=3, warmup=1
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    import_s = float(np.median(imports))
    zr_fps, lr_fps = n / import_s, n / lerobot_all
    table = benchlib.WorkloadTable()
    table.add(
        "LeRobot import, frames/s",
        "zreplay.import_lerobot",
        text=(f"{zr_fps:.0f}/s", ""),
        ratio=zr_fps / lr_fps,
        vs="LeRobotDataset[i], every i",
    )
    table.add("", "LeRobotDataset[i], every i", text=(f"{lr_fps:.0f}/s", ""))
    ratio = benchlib.ratio(zr_sample["median_s"], lr_sample["median_s"])
    table.add(
        "random access, 256 items",
        "zreplay view.sample(256)",
        median=zr_sample["median_s"],
        p90=zr_sample["p90_s"],
        ratio=ratio,
        vs="256 random LeRobotDataset[i]",
    )
    table.add(
        "", "256 random LeRobotDataset[i]", median=lr_sample["median_s"], p90=lr_sample["p90_s"]
    )
    print(f"dataset: {a.episodes} episodes x {a.length} frames, {a.size}x{a.size} video + image")
    print(table.text())
    result = {
        "benchmark": "lerobot",
        "machine": benchlib.machine_info(),
        "config": vars(a) | {"out": str(a.out), "frames": n},
        "rows": [
            {
                "figure": f"LeRobot import ({a.size}px video + image), frames/s",
                "zreplay": f"{zr_fps:.0f}/s",
                "peer": f"LeRobotDataset[i] decoding every item {lr_fps:.0f}/s",
                "ratio": zr_fps / lr_fps,
            },
            {
                "figure": "LeRobot random access: sample(256) vs 256 random LeRobotDataset[i]",
                "zreplay": benchlib.fmt_time(zr_sample["median_s"]),
                "peer": f"LeRobotDataset {benchlib.fmt_time(lr_sample['median_s'])}",
                "ratio": ratio,
            },
        ],
        "import_s": imports,
        "lerobot_decode_all_s": lerobot_all,
        "sample_zreplay": zr_sample,
        "sample_lerobot": lr_sample,
    }
    benchlib.write_json(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
