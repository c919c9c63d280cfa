"""Store reads of image-codec arrays against zstd through TensorStore and a raw memmap.

The same frames (64x64x3 simulator frames; 224x224x3 windows panned over a photo with
sensor noise) are stored three ways: a zreplay buffer with the key's default codec
(``rowdiff``, read by zreplay's own shard reader), a buffer with ``codec="zstd"``
(level 1, read through TensorStore) and a raw ``.npy`` file read through a numpy
memmap.  Each is read at the store seam, as the engine's disk tier reads it
(``array[rows].read()``: no RAM tier, no decoded-chunk cache, no column cache; the page
cache warm): 256 random rows (sorted, unique, as the engine asks) and a contiguous range
of 4096 rows (``--range``).

``--sides`` names source trees to compare (``name=path/to/src``; default this checkout's
``src``): every side runs in its own child process, the sides take turns round after
round (``--rounds``) so a load that comes and goes falls on all alike, and each child
times the three stores in turn too.  Prints a table of medians with the rowdiff read's
ratio to zstd and to the memmap, the load average before and after, and writes JSON
(``--out``; default benchmarks/results/latest/image-reads.json).

    python benchmarks/bench_image_reads.py --sides base=/path/to/main/src new=src
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

HERE = Path(__file__).resolve().parent
STORES = ("rowdiff", "zstd", "memmap")
GATHER = 256


def photo_frames(n: int, size: int, seed: int) -> np.ndarray:
    """u8[n, size, size, 3]: a window sliding and drifting over a photo (scikit-image's
    astronaut, tiled where the window runs past it), with sensor noise (sigma 2)."""
    import skimage.data

    img = skimage.data.astronaut()
    big = np.concatenate([img, img[::-1]], axis=0)
    big = np.concatenate([big, big[:, ::-1]], axis=1)
    rng = np.random.default_rng(seed)
    span_y, span_x = big.shape[0] - size, big.shape[1] - size
    t = np.arange(n) / max(1, n - 1)
    ys = ((0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) * span_y).astype(int)
    xs = ((0.5 - 0.5 * np.cos(2 * np.pi * 5 * t)) * span_x).astype(int)
    out = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        crop = big[ys[i] : ys[i] + size, xs[i] : xs[i] + size].astype(np.int16)
        out[i] = np.clip(crop + rng.normal(0, 2, crop.shape).round(), 0, 255)
    return out


def build(work: Path, name: str, frames: np.ndarray) -> dict:
    """The three stores of ``frames`` under ``work/name``: their array paths."""
    import zreplay

    paths = {}
    for codec in ("rowdiff", "zstd"):
        path = work / f"{name}-{codec}"
        buf = zreplay.ReplayBuffer(
            max_steps=len(frames), path=path, seed=0, layout={"pixels": {"codec": codec}}
        )
        step = 512
        for a in range(0, len(frames), step):
            part = frames[a : a + step]
            buf.write_episode({"pixels": part, "action": np.zeros((len(part), 2), np.float32)})
        buf.close()
        paths[codec] = str(path / "segments" / "default" / "data" / "pixels")
    raw = work / f"{name}.npy"
    np.save(raw, frames)
    paths["memmap"] = str(raw)
    return paths


def child(spec: dict) -> dict:
    """Times of each read of each store (runs with the side's zreplay on sys.path)."""
    from zreplay.store.backend_local import LocalBackend

    backend = LocalBackend()
    ctx = backend.array_context(False, 0)
    return {c["name"]: time_case(backend, ctx, c, spec["repeats"]) for c in spec["cases"]}


def time_case(backend, ctx, case: dict, repeats: int) -> dict:
    arrays = {
        "rowdiff": backend.open_array(Path(case["paths"]["rowdiff"]), False, ctx)[0],
        "zstd": backend.open_array(Path(case["paths"]["zstd"]), False, ctx)[0],
    }
    mm = np.load(case["paths"]["memmap"], mmap_mode="r")
    rows = np.asarray(case["rows"], np.int64)
    a, z = case["range"]
    reads = {}
    for store, arr in arrays.items():
        reads[(store, "gather")] = lambda arr=arr: arr[rows].read().result()
        reads[(store, "range")] = lambda arr=arr: arr[a:z].read().result()
    reads[("memmap", "gather")] = lambda: np.ascontiguousarray(mm[rows])
    reads[("memmap", "range")] = lambda: np.array(mm[a:z])
    want = {"gather": mm[rows], "range": mm[a:z]}
    for (store, kind), fn in reads.items():  # warm-up, and every store reads the same
        if not np.array_equal(fn(), want[kind]):
            raise SystemExit(f"{case['name']}: {store} {kind} read other pixels")
    times: dict = {f"{s}/{k}": [] for s, k in reads}
    for _ in range(repeats):
        for (store, kind), fn in reads.items():
            t0 = time.perf_counter()
            fn()
            times[f"{store}/{kind}"].append(time.perf_counter() - t0)
    return times


def run_side(src: str, spec_file: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": src}
    got = subprocess.run(
        [sys.executable, __file__, "--child", str(spec_file)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if got.returncode:
        raise SystemExit(f"child for {src} failed:\n{got.stderr[-4000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sides", nargs="+", default=[f"this={HERE.parent / 'src'}"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="timed reads per child")
    ap.add_argument("--range", type=int, default=4096, help="rows of the contiguous read")
    ap.add_argument("--frames", type=int, default=4096, help="frames stored per shape")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "latest" / "image-reads.json")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child.read_text()))))
        return 0
    sides = dict(s.split("=", 1) for s in args.sides)
    sys.path.insert(0, str(Path(next(iter(sides.values()))).resolve()))
    n = max(args.frames, args.range)
    work = Path(tempfile.mkdtemp(prefix="zreplay-bench-image-reads-"))
    rng = np.random.default_rng(0)
    try:
        sets = {
            "64x64x3": benchlib.sim_frames(rng, n, 1)[:, 0],
            "224x224x3": photo_frames(n, 224, seed=0),
        }
        cases = []
        for name, frames in sets.items():
            paths = build(work, name, frames)
            for p in paths.values():
                benchlib.warm_page_cache(p)
            rows = np.sort(rng.choice(n, min(GATHER, n), replace=False))
            cases.append(
                {"name": name, "paths": paths, "rows": rows.tolist(), "range": [0, args.range]}
            )
        spec_file = work / "spec.json"
        spec_file.write_text(json.dumps({"cases": cases, "repeats": args.repeats}))
        load_before = os.getloadavg()
        times: dict = {side: {} for side in sides}
        for _ in range(args.rounds):
            for side, src in sides.items():
                for case, per in run_side(src, spec_file).items():
                    for what, t in per.items():
                        times[side].setdefault(case, {}).setdefault(what, []).extend(t)
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "machine": benchlib.machine_info(),
        "load_before": load_before,
        "load_after": load_after,
        "frames": n,
        "gather_rows": GATHER,
        "range_rows": args.range,
        "sides": sides,
        "results": {},
    }
    lines = [
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
        f"({os.cpu_count()} cores); medians of {args.rounds} x {args.repeats} reads",
        f"{'side':<8} {'frames':<10} {'read':<7} {'rowdiff':>10} {'zstd TS':>10} "
        f"{'memmap':>10} {'/zstd':>7} {'/memmap':>8}",
    ]
    for side, per_case in times.items():
        for case, per in per_case.items():
            for kind in ("gather", "range"):
                med = {s: float(np.median(per[f"{s}/{kind}"])) for s in STORES}
                entry = {s: benchlib.stats(per[f"{s}/{kind}"]) for s in STORES}
                entry["rowdiff_over_zstd"] = med["rowdiff"] / med["zstd"]
                entry["rowdiff_over_memmap"] = med["rowdiff"] / med["memmap"]
                result["results"].setdefault(side, {}).setdefault(case, {})[kind] = entry
                lines.append(
                    f"{side:<8} {case:<10} {kind:<7} {med['rowdiff'] * 1e3:>8.2f}ms "
                    f"{med['zstd'] * 1e3:>8.2f}ms {med['memmap'] * 1e3:>8.2f}ms "
                    f"{entry['rowdiff_over_zstd']:>7.2f} {entry['rowdiff_over_memmap']:>8.2f}"
                )
    print("\n".join(lines))
    benchlib.write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
