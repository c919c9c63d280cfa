"""The README's demo: fill a buffer on disk, sample, close, reopen, sample again.

Run it with ``zreplay demo`` (or ``python -m zreplay.cli.demo``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

import zreplay

from ..store.root import is_buffer
from .output import positive_int
from .paths import check_output


def rollout(rng: np.random.Generator, step0: int, T: int = 20, B: int = 4, C: int = 2, A: int = 7):
    """A synthetic embodied-RL rollout chunk in RLinf's layout ``[T, B, ...]``.

    Images are smooth scenes with a moving object (they compress like real frames);
    ``dones`` carry RLinf's per-epoch bootstrap row (2 epochs).
    """
    t = np.arange(T)[:, None, None, None]
    b = np.arange(B)[None, :, None, None]
    yy, xx = np.mgrid[0:64, 0:64]
    x0 = (step0 + t * 3 + b * 11) % 56
    scene = (xx[None, None] // 4 * 8 + yy[None, None] * 2 + b * 20) % 256
    obj = (np.abs(xx[None, None] - x0 - 4) < 4) & (np.abs(yy[None, None] - 30) < 4)
    gray = np.where(obj, 255, scene).astype(np.uint8)
    images = np.stack([gray, gray // 2, 255 - gray], axis=-1)  # [T, B, 64, 64, 3]
    states = rng.standard_normal((T + 1, B, 16)).astype(np.float32)
    dones = np.zeros((T + 2, B, C), bool)
    dones[[5, 15]] = rng.random((2, B, C)) < 0.2
    return zreplay.Trajectory(
        max_episode_length=100,
        actions=torch.from_numpy(rng.uniform(-1, 1, (T, B, C * A)).astype(np.float32)),
        intervene_flags=torch.zeros(T, B, C * A, dtype=torch.bool),
        rewards=torch.from_numpy(rng.standard_normal((T, B, C)).astype(np.float32)),
        dones=torch.from_numpy(dones),
        terminations=torch.from_numpy(dones),
        truncations=torch.zeros(T + 2, B, C, dtype=torch.bool),
        versions=torch.full((T, B, 1), float(step0 // 100)),
        curr_obs={"main_images": torch.from_numpy(images), "states": torch.from_numpy(states[:-1])},
        next_obs={
            "main_images": torch.from_numpy(np.roll(images, -1, axis=0)),
            "states": torch.from_numpy(states[1:]),
        },
    )


def _du(path: Path) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def _shapes(batch, prefix=""):
    out = []
    for k, v in batch.items():
        if isinstance(v, dict):
            out += _shapes(v, f"{prefix}{k}/")
        else:
            out.append(f"{prefix}{k} {list(v.shape)} {str(v.dtype).replace('torch.', '')}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="zreplay demo", description=__doc__)
    ap.add_argument("--path", default="demo_buffer.zarr", help="buffer directory (recreated)")
    ap.add_argument("--trajectories", type=positive_int, default=40)
    args = ap.parse_args(argv)
    path = Path(args.path)
    # Recreate only an earlier demo (any zreplay buffer): refuse a file or someone's folder
    # here, before anything is written, rather than deep inside the buffer's constructor.
    check_output(path, True, is_buffer, "a zreplay buffer")
    rng = np.random.default_rng(0)

    print(f"1. filling {path} with {args.trajectories} rollouts of [T=20, B=4] ...")
    buf = zreplay.TrajectoryReplayBuffer(
        seed=1234,
        cache_size=8,
        sample_window_size=0,
        auto_save=True,
        auto_save_path=str(path),
        overwrite=True,
    )
    trajs = [rollout(rng, 100 * i) for i in range(args.trajectories)]
    raw = sum(
        v.numel() * v.element_size()
        for t in trajs
        for v in [t.actions, t.rewards, t.dones, *t.curr_obs.values(), *t.next_obs.values()]
    )
    t0 = time.perf_counter()
    for t in trajs:
        buf.add_trajectories([t])
    t_add = time.perf_counter() - t0
    buf.flush()
    t_all = time.perf_counter() - t0
    print(
        f"   add_trajectories: {1e3 * t_add / len(trajs):.2f} ms per call; "
        f"committed to disk after {t_all:.2f} s ({raw / t_all / 1e6:.0f} MB/s raw)"
    )
    print(f"   {len(buf)} trajectories, {buf.total_samples} transitions")

    batch = buf.sample(256)
    print("2. sample(256) ->")
    for line in _shapes(batch):
        print(f"     {line}")
    buf.close()
    size = _du(path)
    print(f"3. closed. {size / 1e6:.1f} MB on disk for {raw / 1e6:.1f} MB raw ({raw / size:.1f}x)")

    t0 = time.perf_counter()
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path))
    print(
        f"4. reopened in {1e3 * (time.perf_counter() - t0):.0f} ms: {len(buf)} trajectories, "
        f"{buf.total_samples} transitions (resumed, same random stream)"
    )
    batch = buf.sample(256)
    print(
        f"   sample(256) again: actions {list(batch['actions'].shape)}, "
        f"curr_obs/main_images {list(batch['curr_obs']['main_images'].shape)}"
    )
    buf.close()

    view = zreplay.open(path)
    first = view.trajectory(0)
    print(
        f"5. zreplay.open(): {view.num_trajectories} trajectories, {view.num_rows} rows; "
        f"trajectory(0) curr_obs/main_images {list(first['curr_obs']['main_images'].shape)}; "
        "plain zarr: zarr.open_group(path, mode='r')['segments/default/data']"
    )
    ok = np.array_equal(first["curr_obs"]["main_images"], trajs[0].curr_obs["main_images"].numpy())
    print(f"   round trip of trajectory 0 bit-exact: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
