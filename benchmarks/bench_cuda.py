#!/usr/bin/env python
"""The CUDA path, checked and timed: ``TrajectoryReplayBuffer.sample(device="cuda",
pin_memory=True)``, ``prefetch(..., device="cuda")`` and the same rows moved by hand.

Every row carries its own number (``actions[:, 0]``) and images derived from it, so each
batch that reaches the GPU is checked row by row there: a torn row, a pinned buffer
reused before its asynchronous copy finished, or rows from the wrong place fail the run
(exit 1) instead of only slowing it.

Figures, each the median of ``--repeats`` calls with ``torch.cuda.synchronize()`` before
the clock stops, for RLinf-like image trajectories [T=50, B=8] (``curr_obs/main_images``
u8[S, S, 3] for S in ``--sizes``, ``states`` f32[16], ``actions`` f32[28], ``rewards``
f32[4], ``dones`` bool[4]) and rows held in the RAM tier or read from disk
(``enable_cache=False``, page cache warm):

    cpu          sample(n)                                   (no GPU)
    to_after     sample(n), then .to("cuda") per tensor       (what a user writes by hand)
    device       sample(n, device="cuda")
    pinned       sample(n, device="cuda", pin_memory=True)    (gathered into page-locked
                                                               memory, copied non_blocking)
    step         a stand-in training step on the GPU (matrix products, ``--step-ms``)
    sync_loop    per step: pinned sample, then the step
    prefetch     per step: next(prefetch(n, depth=2, device="cuda", pin_memory=True)), then
                 the step: the reads and copies overlap the step

    python benchmarks/bench_cuda.py                       # on a CUDA machine, ~2 min
    python benchmarks/bench_cuda.py --quick --out /tmp/cuda.json

Without CUDA it checks the CPU half, says so and exits 0 (nothing to measure).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import zreplay  # noqa: E402
from zreplay import TrajectoryReplayBuffer  # noqa: E402

# Column cache files of the buffers this benchmark makes: a directory of this run,
# removed at its end (children inherit it), not the user's ~/.cache.
if "ZREPLAY_CACHE_DIR" not in os.environ:
    os.environ["ZREPLAY_CACHE_DIR"] = tempfile.mkdtemp(prefix="zreplay-bench-cols-")
    atexit.register(shutil.rmtree, os.environ["ZREPLAY_CACHE_DIR"], True)

T, B = 50, 8


def trajectory(first_row: int, size: int) -> zreplay.Trajectory:
    """Rows ``first_row .. first_row + T*B`` (time-major, as the buffer flattens them): each
    row's number in ``actions[..., 0]`` and in the images it can be checked against."""
    rows = first_row + np.arange(T * B).reshape(T, B)
    actions = np.zeros((T, B, 28), np.float32)
    actions[..., 0] = rows
    images = np.empty((T, B, size, size, 3), np.uint8)
    images[...] = (rows % 251).astype(np.uint8)[..., None, None, None]
    images[..., 0, 0, 1] = (rows // 251 % 251).astype(np.uint8)
    states = np.repeat(rows[..., None].astype(np.float32), 16, axis=-1)
    return zreplay.Trajectory(
        max_episode_length=T,
        actions=torch.from_numpy(actions),
        rewards=torch.zeros(T, B, 4),
        dones=torch.zeros(T + 1, B, 4, dtype=torch.bool),
        curr_obs={"main_images": torch.from_numpy(images), "states": torch.from_numpy(states)},
    )


def check(batch: dict, where: str) -> None:
    """Every row of ``batch`` is the row its number says (on the batch's own device)."""
    rows = batch["actions"][:, 0].round().long()
    imgs = batch["curr_obs"]["main_images"]
    low = (rows % 251).to(torch.uint8)
    high = (rows // 251 % 251).to(torch.uint8)
    ok = bool((imgs[:, 1:, :, :] == low[:, None, None, None]).all())
    ok &= bool((imgs[:, 0, 0, 1] == high).all()) and bool((imgs[:, 0, 0, 0] == low).all())
    ok &= bool((batch["curr_obs"]["states"] == rows[:, None].float()).all())
    if not ok:
        raise SystemExit(f"FAIL: a batch {where} holds rows that are not the rows it names")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_ms(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def make_step(step_ms: float):
    """A GPU 'training step' of about ``step_ms`` (bf16 matrix products)."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    one = median_ms(lambda: a @ a, 10)
    k = max(1, round(step_ms / max(one, 1e-3)))

    def step(batch=None):
        x = a
        for _ in range(k):
            x = a @ a
        if batch is not None:
            check(batch, "used in a training step")
        return x

    return step


def measure(path: Path, size: int, n: int, tier: str, args, cuda: bool) -> dict:
    kw = {"seed": 7, "auto_save": True, "auto_save_path": str(path)}
    if tier == "disk":
        kw["enable_cache"] = False
    else:
        kw["ram_budget_bytes"] = 16 << 30
    buf = TrajectoryReplayBuffer(**kw, sample_window_size=0)
    out = {"size": size, "n": n, "tier": tier, "rows": buf.total_samples}
    try:
        check(buf.sample(n), "on the CPU")
        out["cpu_ms"] = median_ms(lambda: buf.sample(n), args.repeats)
        if not cuda:
            return out
        check(buf.sample(n, device="cuda"), "sampled to cuda")
        check(buf.sample(n, device="cuda", pin_memory=True), "sampled pinned to cuda")

        def to_after():
            return {
                k: (v.to("cuda") if torch.is_tensor(v) else {j: w.to("cuda") for j, w in v.items()})
                for k, v in buf.sample(n).items()
            }

        check(to_after(), "moved by hand")
        out["to_after_ms"] = median_ms(to_after, args.repeats)
        out["device_ms"] = median_ms(lambda: buf.sample(n, device="cuda"), args.repeats)
        out["pinned_ms"] = median_ms(
            lambda: buf.sample(n, device="cuda", pin_memory=True), args.repeats
        )
        step = make_step(args.step_ms)
        out["step_ms"] = median_ms(step, args.repeats)
        out["sync_loop_ms"] = median_ms(
            lambda: step(buf.sample(n, device="cuda", pin_memory=True)), args.repeats
        )
        with buf.prefetch(n, depth=2, device="cuda", pin_memory=True) as it:
            out["prefetch_ms"] = median_ms(lambda: step(next(it)), args.repeats)
        out["overlap"] = round(out["sync_loop_ms"] / out["prefetch_ms"], 2)
        return out
    finally:
        buf.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 224])
    ap.add_argument("--trajectories", type=int, default=40)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help="fewer trajectories and repeats")
    ap.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = ap.parse_args(argv)
    if args.quick:
        args.trajectories, args.repeats = 8, 8
    cuda = torch.cuda.is_available()
    from benchlib import machine_info  # commit, time and CPU, for benchmarks/report.py

    info = {
        **machine_info(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if cuda else None,
        "zarr": __import__("zarr").__version__,
    }
    print(json.dumps(info))
    if cuda:
        try:
            TrajectoryReplayBuffer().sample(1, device=f"cuda:{torch.cuda.device_count()}")
        except zreplay.errors.DeviceUnavailableError as e:
            print(f"an absent device is refused: {e}")
        except Exception as e:  # an empty buffer may refuse first: the device check comes first
            raise SystemExit(f"FAIL: an absent device gave {type(e).__name__}: {e}") from e
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            path = Path(tmp) / f"buf{size}"
            t0 = time.perf_counter()
            with TrajectoryReplayBuffer(seed=1, auto_save=True, auto_save_path=str(path)) as w:
                for i in range(args.trajectories):
                    w.add_trajectories([trajectory(i * T * B, size)])
            print(
                f"S={size}: {args.trajectories * T * B} rows written in "
                f"{time.perf_counter() - t0:.1f} s"
            )
            for tier in ("ram", "disk"):
                r = measure(path, size, args.batch, tier, args, cuda)
                results.append(r)
                print(json.dumps(r))
    cols = [
        "size",
        "tier",
        "cpu_ms",
        "to_after_ms",
        "device_ms",
        "pinned_ms",
        "step_ms",
        "sync_loop_ms",
        "prefetch_ms",
        "overlap",
    ]
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in results:
        print(
            "| "
            + " | ".join(
                f"{r[c]:.2f}" if isinstance(r.get(c), float) else str(r.get(c, "-")) for c in cols
            )
            + " |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": info, "results": results}, indent=1))
    if not cuda:
        print("no CUDA device: the CPU half was checked, nothing on a GPU was measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
