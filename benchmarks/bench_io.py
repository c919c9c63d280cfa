#!/usr/bin/env python
"""Read-side and I/O benchmark: clips from disk, the disk gather, dumps/exports and
checkpoint loading, each against a peer measured in the same run.

    python benchmarks/bench_io.py                         # default run (~4-6 min here)
    python benchmarks/bench_io.py --quick --out /tmp/io.json
    python benchmarks/bench_io.py --only clips,gather --zreplay-src /tmp/main-src

Sections (every ratio is zreplay / peer from the same child or the same rounds):

* ``clips``: RLinf-like image data (60 trajectories [50, 8]: two 64x64x3 image keys, 16-d
  states, 28-d actions, rewards and flags; every lane is one 50-step episode) in a zreplay
  buffer on disk, page cache warm.  ``zreplay.open(p).sample_clips(32, history_len=8)``
  (defaults; and with ``chunk_cache_bytes`` holding every image chunk) against TorchRL
  0.14's ``TensorDictReplayBuffer(LazyMemmapStorage, SliceSampler(slice_len=8,
  traj_key="episode", strict_length=True, cache_values=True))`` on the same rows, files
  mapped: ``rb.sample(256)`` (32 slices of 8).  Calls alternate zreplay / TorchRL in one
  process.  Also ``PrioritizedClips`` on the view, and the decode limit: zstd decoding exactly the image chunks one clip batch needs, 2 threads.
* ``gather``: ``sample(256)`` of the same buffer reopened with ``enable_cache=False``
  against a raw TensorStore gather of the same kind of rows (every key's read in flight,
  sorted unique rows, scattered back), alternating call by call; plus the decode limit of
  those rows' chunks (numcodecs, 2 threads) and a cProfile of zreplay's sample.
* ``dump``: a stable-worldmodel-like buffer of 3,200 steps in 278 episodes (two 64x64x3
  image columns + small columns, 79 MB raw): ``ReplayBuffer.dump(f, format="hdf5")``
  against plain h5py writing the same columns from RAM (same chunks, shuffle + gzip-4,
  one write per dataset); ``dump(format="zarr")``; ``export(format="pt")`` of 12 RLinf
  trajectories (240 MB) against a ``torch.save`` loop of the same dicts (with and without
  fsync).  Rounds alternate zreplay / peer.
* ``ckpt``: RLinf's workload: 60 trajectories [50, 8], both buffers built with
  ``auto_save=True`` and defaults, each checkpointed once; then per round, in fresh
  processes, ``load_checkpoint`` into a fresh buffer (zreplay; RLinf 0.3's
  ``TrajectoryReplayBuffer``), then the first ``sample(256)``; zreplay also reports when
  its RAM tier is full again (it refills in the background).  RLinf runs in its own
  environment: ``pip install --no-deps --target <dir> rlinf==0.3.0 omegaconf==2.3.0
  antlr4-python3-runtime==4.9.3`` (done by this script into ``--rlinf-env``, default
  ``benchmarks/.rlinf-env``; never a dependency of zreplay), put on the RLinf child's
  ``sys.path`` with stubs for ``rlinf.scheduler`` (which imports ray; the buffer only
  asks it for a logger).

``--zreplay-src DIR`` runs the zreplay side from another tree's ``src`` (e.g. ``git
archive`` of main) for before/after tables.  Machine load (other processes' CPU during
every child, load average) is in the JSON.  Nothing asserts on timings.
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
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (  # noqa: E402
    CpuMeter,
    WorkloadTable,
    describe_machine,
    nest,
    ratio,
    rlinf_image_trajectory,
    run_child_job,
    sim_frames,
    stats,
    warm_allocator,
    warm_page_cache,
    write_json,
)

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "latest" / "io.json"
RLINF_PINS = ("rlinf==0.3.0", "omegaconf==2.3.0", "antlr4-python3-runtime==4.9.3")
IMG_T, IMG_B, H, W = 50, 8, 64, 64
POOL = 4
SECTIONS = ("clips", "gather", "dump", "ckpt")

CONFIGS = {
    "default": {
        "traj": 60,
        "clip_repeats": 300,
        "gather_repeats": 200,
        "dump_rounds": 5,
        "export_traj": 12,
        "ckpt_rounds": 5,
    },
    "quick": {
        "traj": 16,
        "clip_repeats": 40,
        "gather_repeats": 30,
        "dump_rounds": 2,
        "export_traj": 4,
        "ckpt_rounds": 2,
    },
}


# -- data (generated once in the parent) ----------------------------------------------


def make_images(rng: np.random.Generator, n: int, b: int) -> np.ndarray:
    return sim_frames(rng, n, b, H, W)


def image_trajectory(seed: int) -> dict:
    """One RLinf-like trajectory [50, 8] (flat key paths)."""
    return rlinf_image_trajectory(seed, IMG_T, IMG_B, H, W)


def swm_episodes(seed: int = 5) -> list[dict]:
    """278 episodes, 3,200 steps: ``pixels``, ``goal`` u8[64,64,3], ``action`` f32[2],
    ``state`` f32[8], ``reward`` f32 (79 MB raw)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(2, 22, 278)
    lens = (lens * 3200 / lens.sum()).astype(np.int64)
    lens[-1] += 3200 - lens.sum()
    frames = make_images(rng, 200, 8).reshape(-1, H, W, 3)
    eps, o = [], 0
    for L in lens:
        idx = (o + np.arange(L)) % len(frames)
        o += L
        eps.append(
            {
                "pixels": frames[idx],
                "goal": frames[(idx + 7) % len(frames)],
                "action": rng.standard_normal((L, 2)).astype(np.float32),
                "state": rng.standard_normal((L, 8)).astype(np.float32),
                "reward": rng.standard_normal(L).astype(np.float32),
            }
        )
    return eps


def save_pool(wdir: Path) -> None:
    for i in range(POOL):
        np.savez(wdir / f"traj{i}.npz", **image_trajectory(7000 + i))
    eps = swm_episodes()
    np.savez(wdir / "swm.npz", **{f"{i}/{k}": v for i, e in enumerate(eps) for k, v in e.items()})


def load_pool(wdir: Path) -> list[dict]:
    out = []
    for i in range(POOL):
        with np.load(wdir / f"traj{i}.npz") as z:
            out.append({k: z[k] for k in z.files})
    return out


def load_swm(wdir: Path) -> list[dict]:
    with np.load(wdir / "swm.npz") as z:
        eps: dict[int, dict] = {}
        for name in z.files:
            i, k = name.split("/", 1)
            eps.setdefault(int(i), {})[k] = z[name]
    return [eps[i] for i in sorted(eps)]


# -- children ----------------------------------------------------------------------------


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def alternate(fns: dict, repeats: int, warmup: int = 3, block: int = 20) -> dict:
    """``repeats`` calls of every function, in blocks of ``block`` calls taking turns
    (order rotating): stats per name.  Blocks, not single calls, take turns because
    torch's intra-op threads keep spinning for a while after an op and would tax
    whatever runs right after them."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    out = {n: [] for n in names}
    for i in range(-(-repeats // block)):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            for _ in range(min(block, repeats - len(out[n]))):
                out[n].append(timed(fns[n]))
    return {n: stats(v) for n, v in out.items()}


def build_rlinf_like(zreplay, path: Path, pool: list[dict], n: int) -> None:
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path))
    for i in range(n):
        buf.add_trajectories([nest(pool[i % POOL])])
    buf.close()


def decode_limit(seg: Path, keys: list[str], rows: np.ndarray, threads: int = 2) -> dict:
    """Seconds to decode (zstd/blosc, or the key's image codec) exactly the inner chunks ``rows`` of ``keys`` need
    (shard index parsed here, chunk bytes read once beforehand; crc32c not checked)."""
    from concurrent.futures import ThreadPoolExecutor

    import numcodecs

    blobs = []
    for key in keys:
        meta = json.loads((seg / key / "zarr.json").read_text())
        shard = meta["codecs"][0]["configuration"]
        inner = shard["chunk_shape"][0]
        shard_rows = meta["chunk_grid"]["configuration"]["chunk_shape"][0]
        first = shard["codecs"][0]
        if first["name"].startswith("zreplay."):  # an image codec: array -> bytes itself
            from zreplay.store.imagecodec import chunk_codec, format_of

            codec = chunk_codec(
                format_of(first["name"]),
                first.get("configuration") or {},
                shard["chunk_shape"],
            )
        else:
            comp = shard["codecs"][1]
            codec = numcodecs.get_codec(
                {
                    "id": comp["name"],
                    **{k: v for k, v in comp["configuration"].items() if k != "checksum"},
                }
                if comp["name"] == "zstd"
                else {
                    "id": "blosc",
                    "cname": comp["configuration"]["cname"],
                    "clevel": comp["configuration"]["clevel"],
                    "shuffle": 1,
                }
            )
        n_inner = shard_rows // inner
        nd = len(meta["shape"])
        # (format 5 names shards "c.<i>.0...", older formats "c/<i>/0...")
        sep = meta["chunk_key_encoding"].get("configuration", {}).get("separator", "/")
        chunks = np.unique(rows // inner)
        for s in np.unique(chunks * inner // shard_rows):
            data = (seg / key / sep.join(["c", str(s), *["0"] * (nd - 1)])).read_bytes()
            idx = np.frombuffer(data[-(n_inner * 16 + 4) : -4], "<u8").reshape(-1, 2)
            for c in chunks[chunks * inner // shard_rows == s]:
                o, nb = idx[c % n_inner]
                blobs.append((codec, data[o : o + nb - 4]))
    pool = ThreadPoolExecutor(threads)
    parts = [blobs[i::threads] for i in range(threads)]

    def run():
        list(pool.map(lambda part: [c.decode(b) for c, b in part], parts))

    res = alternate({"decode": run}, 5, warmup=1)["decode"]
    return {**res, "chunks": len(blobs), "compressed_bytes": sum(len(b) for _, b in blobs)}


def child_clips(job: dict) -> dict:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, SliceSampler, TensorDictReplayBuffer

    import zreplay

    wdir, buf = Path(job["wdir"]), Path(job["buf"])
    pool, n = load_pool(wdir), job["cfg"]["traj"]
    # TorchRL: the same rows in zreplay's env-major order, one episode id per lane.
    rows = {k: [] for k in pool[0]}
    for i in range(n):
        for k, v in pool[i % POOL].items():
            rows[k].append(np.swapaxes(v, 0, 1).reshape(IMG_T * IMG_B, *v.shape[2:]))
    flat = {k: np.concatenate(v) for k, v in rows.items()}
    N = len(flat["actions"])
    flat["episode"] = np.repeat(np.arange(N // IMG_T), IMG_T)
    td = TensorDict({k: torch.from_numpy(v) for k, v in flat.items()}, batch_size=[N])
    rb = TensorDictReplayBuffer(
        storage=LazyMemmapStorage(N, scratch_dir=str(wdir / "memmap"), existsok=True),
        sampler=SliceSampler(
            slice_len=8, traj_key="episode", strict_length=True, cache_values=True
        ),
        batch_size=256,
    )
    rb.extend(td)
    warm_page_cache(buf)
    os.sync()
    view = zreplay.open(buf, seed=0)
    figs = {"zreplay view": lambda: view.sample_clips(32, history_len=8)}
    import inspect

    if "chunk_cache_bytes" in inspect.signature(zreplay.open).parameters:
        hot = zreplay.open(buf, seed=0, chunk_cache_bytes=2 * N * H * W * 3 + (64 << 20))
        for _ in range(N // 256 + 1):
            hot.sample_clips(32, history_len=8)  # warm its chunk cache (uniform draws)
        for k in ("curr_obs/main_images", "next_obs/main_images"):
            hot.core.rows(np.arange(N), [k])
        figs["zreplay view, chunk_cache_bytes"] = lambda: hot.sample_clips(32, history_len=8)
    threads = torch.get_num_threads()

    def trl(n: int):
        # torch's intra-op threads spin while they wait: on a busy 2-core machine one
        # thread can be several times faster than the default, so both are measured
        # and the faster one is the peer.
        torch.set_num_threads(n)
        try:
            return rb.sample()
        finally:
            torch.set_num_threads(threads)

    figs["TorchRL LazyMemmap SliceSampler"] = lambda: trl(threads)
    figs["TorchRL LazyMemmap SliceSampler, 1 torch thread"] = lambda: trl(1)
    res = alternate(figs, job["cfg"]["clip_repeats"])
    got = rb.sample()
    assert got.shape[0] == 256 and bool((got["episode"].reshape(32, 8).diff(1) == 0).all())
    try:
        from zreplay.samplers import PrioritizedClips

        pv = zreplay.open(buf, seed=0, sampler=PrioritizedClips(history_len=8))
        res.update(
            alternate({"zreplay view PrioritizedClips sample(32)": lambda: pv.sample(32)}, 60)
        )
    except ImportError:
        pass
    # Where the time goes: the same rows with the image keys stored lz4 or uncompressed
    # (layout overrides; the codec choice itself is the add path's), read the same way.
    imgs = ("curr_obs/main_images", "next_obs/main_images")
    probes = {"zreplay view, images in the default codec": view}
    for name, codec in (
        ("zstd-1", {"codec": "zstd", "level": 1}),
        ("lz4-5", {"codec": "lz4", "level": 5}),
        ("uncompressed", {"codec": "none"}),
    ):
        path = wdir / f"img_{name}"
        b = zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=str(path), layout={k: dict(codec) for k in imgs}
        )
        for i in range(n):
            b.add_trajectories([nest(pool[i % POOL])])
        b.close()
        warm_page_cache(path)
        probes[f"zreplay view, images {name}"] = zreplay.open(path, seed=0)
    res.update(
        alternate(
            {k: (lambda v=v: v.sample_clips(32, history_len=8)) for k, v in probes.items()}, 60
        )
    )
    rng = np.random.default_rng(1)
    lane = rng.integers(0, N // IMG_T, 32)
    clip_rows = ((lane * IMG_T + rng.integers(0, IMG_T - 7, 32))[:, None] + np.arange(8)).ravel()
    seg = buf / "segments" / "default" / "data"
    res["decode limit: image chunks of 32 clips, 2 threads"] = decode_limit(
        seg, ["curr_obs/main_images", "next_obs/main_images"], clip_rows
    )
    return {"figures": res, "rows": N}


def child_gather(job: dict) -> dict:
    import cProfile
    import io
    import pstats

    import tensorstore as ts

    import zreplay

    buf = Path(job["buf"])
    warm_page_cache(buf)
    b = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(buf), enable_cache=False, sample_window_size=0
    )
    keys = b.core.keys
    seg = buf / "segments" / "default" / "data"
    ctx = ts.Context({"cache_pool": {"total_bytes_limit": 0}})
    stores = {
        k: ts.open(
            {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{seg / k}/"}},
            read=True,
            context=ctx,
        ).result()
        for k in keys
    }
    N = b.total_samples
    rng = np.random.default_rng(2)

    def raw():
        uniq, inv = np.unique(rng.integers(0, N, 256), return_inverse=True)
        futs = {k: s[uniq].read() for k, s in stores.items()}
        return {k: f.result()[inv] for k, f in futs.items()}

    view = zreplay.open(buf, seed=0)
    figs = {
        "zreplay sample(256), enable_cache=False": lambda: b.sample(256),
        "raw TensorStore gather": raw,
        "zreplay.open(p).sample(256)": lambda: view.sample(256),
    }
    res = alternate(figs, job["cfg"]["gather_repeats"])
    rows = np.unique(rng.integers(0, N, 256))
    res["decode limit: all keys' chunks of 256 rows, 2 threads"] = decode_limit(seg, keys, rows)
    res["decode limit: image chunks of 256 rows, 2 threads"] = decode_limit(
        seg, [k for k in keys if "images" in k], rows
    )
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(50):
        b.sample(256)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(8)
    b.close()
    return {"figures": res, "rows": N, "profile": s.getvalue()[-3000:]}


def _plain_h5(path: Path, cols: dict) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        for k, a in cols.items():
            row = max(1, a[0].nbytes)
            ch = max(1, min(65536, (1 << 20) // row))
            f.create_dataset(
                k,
                data=a,
                chunks=(ch, *a.shape[1:]),
                maxshape=(None, *a.shape[1:]),
                compression="gzip",
                compression_opts=4,
                shuffle=True,
            )


def child_dump(job: dict) -> dict:
    import torch

    import zreplay

    wdir, side = Path(job["wdir"]), job["side"]
    out, res = wdir / f"out_{side}", {}
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    if side == "zreplay":
        rb = zreplay.ReplayBuffer(max_steps=10_000, path=str(job["swm"]))
        view = zreplay.open(job["swm"])
        warm_page_cache(job["swm"])
        res["ReplayBuffer.dump hdf5"] = timed(lambda: rb.dump(out / "d.h5", format="hdf5"))
        res["zreplay.dump(view) hdf5"] = timed(lambda: zreplay.dump(view, out / "v.h5"))
        res["ReplayBuffer.dump zarr"] = timed(lambda: rb.dump(out / "d.zarr", format="zarr"))
        rb.close()
        tb = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(job["exp"]))
        res["TrajectoryReplayBuffer.export pt"] = timed(lambda: tb.export(str(out / "pt")))
        tb.close()
        res["bytes_h5"] = (out / "d.h5").stat().st_size
    else:
        eps = load_swm(wdir)
        cols = {k: np.concatenate([e[k] for e in eps]) for k in eps[0]}
        res["plain h5py write"] = timed(lambda: _plain_h5(out / "p.h5", cols))
        pool = load_pool(wdir)
        trajs = [
            {
                k: torch.from_numpy(v)
                for k, v in nest(pool[i % POOL]).items()
                if not isinstance(v, dict)
            }
            | {
                g: {k: torch.from_numpy(v) for k, v in d.items()}
                for g, d in nest(pool[i % POOL]).items()
                if isinstance(d, dict)
            }
            for i in range(job["cfg"]["export_traj"])
        ]

        def save(sync: bool):
            for i, t in enumerate(trajs):
                with open(out / f"trajectory_{i}.pt", "wb") as f:
                    torch.save(t, f)
                    if sync:
                        f.flush()
                        os.fsync(f.fileno())

        res["torch.save loop"] = timed(lambda: save(False))
        res["torch.save loop + fsync"] = timed(lambda: save(True))
        res["bytes_h5"] = (out / "p.h5").stat().st_size
    shutil.rmtree(out, ignore_errors=True)
    return res


RLINF_CHILD_SETUP = """
import logging, sys, types
for name in ("rlinf.scheduler", "rlinf.scheduler.worker"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["rlinf.scheduler.worker"].Worker = type(
    "Worker", (), {"logger": logging.getLogger("rlinf")}
)
"""


def rlinf_trajectory(d: dict):
    import torch
    from rlinf.data.embodied_io_struct import Trajectory

    t = torch.from_numpy
    tree = nest(d)
    return Trajectory(
        max_episode_length=IMG_T,
        actions=t(tree["actions"]),
        rewards=t(tree["rewards"]),
        dones=t(tree["dones"]),
        terminations=t(tree["terminations"]),
        truncations=t(tree["truncations"]),
        curr_obs={k: t(v) for k, v in tree["curr_obs"].items()},
        next_obs={k: t(v) for k, v in tree["next_obs"].items()},
    )


def child_ckpt(job: dict) -> dict:
    wdir, side = Path(job["wdir"]), job["side"]
    fresh = wdir / f"fresh_{side}_{job['round']}"
    shutil.rmtree(fresh, ignore_errors=True)
    ckpt = job["ckpt"]
    warm_page_cache(ckpt)
    # Earlier sections leave GBs of dirty pages; their writeback would tax the directory
    # and link operations of whichever load happens to run meanwhile.
    os.sync()
    if side == "rlinf":
        sys.path.insert(0, job["rlinf_env"])
        exec(RLINF_CHILD_SETUP, {})
        from rlinf.data.replay_buffer import TrajectoryReplayBuffer

        if job.get("build"):
            b = TrajectoryReplayBuffer(seed=1234, auto_save=True, auto_save_path=str(job["src"]))
            pool = load_pool(wdir)
            for i in range(job["cfg"]["traj"]):
                b.add_trajectories([rlinf_trajectory(pool[i % POOL])])
            b.sample(1)  # RLinf checkpoints the window of the last sample
            shutil.rmtree(ckpt, ignore_errors=True)
            b.save_checkpoint(str(ckpt))
            b.close(wait=True)
            return {"built": True, "files": len(os.listdir(ckpt))}
        b = TrajectoryReplayBuffer(seed=1, auto_save=True, auto_save_path=str(fresh))
        t0 = time.perf_counter()
        b.load_checkpoint(str(ckpt))
        t1 = time.perf_counter()
        b.sample(256)
        t2 = time.perf_counter()
        out = {"load": t1 - t0, "first sample(256)": t2 - t1, "trajectories": len(b)}
        b.close()
    else:
        import zreplay

        # zreplay imports TensorStore on a process's first array access; the RLinf side's
        # imports (torch, rlinf) are outside its timing too, so this one is reported apart.
        t_imp = time.perf_counter()
        import tensorstore  # noqa: F401

        t_imp = time.perf_counter() - t_imp
        b = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(fresh))
        t0 = time.perf_counter()
        b.load_checkpoint(str(ckpt))
        t1 = time.perf_counter()
        b.sample(256)
        t2 = time.perf_counter()
        full = None
        want = min(b.total_samples, 5 * IMG_T * IMG_B)
        while time.perf_counter() - t0 < 10:
            if b.get_stats()["rows_in_ram"] >= want:
                full = time.perf_counter() - t0
                break
            time.sleep(0.002)
        out = {"load": t1 - t0, "first sample(256)": t2 - t1, "trajectories": len(b)}
        out["RAM tier full again (from the load call)"] = full
        out["tensorstore import (once per process, not in load)"] = t_imp
        b.close()
    shutil.rmtree(fresh, ignore_errors=True)
    return out


CHILDREN = {"clips": child_clips, "gather": child_gather, "dump": child_dump, "ckpt": child_ckpt}


def child_main(job_path: Path) -> int:
    job = json.loads(job_path.read_text())
    warm_allocator()
    try:
        res = CHILDREN[job["section"]](job)
    except Exception as e:  # noqa: BLE001 - reported to the parent
        res = {"error": repr(e), "traceback": traceback.format_exc()}
    Path(job["out"]).write_text(json.dumps(res, default=float))
    return 0


# -- parent ------------------------------------------------------------------------------


def ensure_rlinf(env_dir: Path) -> None:
    if (env_dir / "rlinf" / "data" / "replay_buffer.py").is_file():
        return
    print(f"installing RLinf 0.3 (no dependencies) into {env_dir} ...", flush=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(env_dir)]
    subprocess.run([*cmd, *RLINF_PINS], check=True)


def run(section: str, job: dict, wdir: Path, env: dict, log: list) -> dict:
    job = {
        **job,
        "section": section,
        "tag": f"{section}_{job.get('side', '')}_{job.get('round', 0)}",
    }
    res, sec = run_child_job(__file__, section, job, wdir, env)
    log.append({"section": section, **{k: job.get(k) for k in ("side", "round")}, **sec})
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--tmpdir", type=Path, default=None)
    ap.add_argument("--zreplay-src", type=Path, default=None, help="a tree's src/ to measure")
    ap.add_argument("--rlinf-env", type=Path, default=HERE / ".rlinf-env")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(args.child)
    cfg = CONFIGS["quick" if args.quick else "default"]
    only = [s for s in args.only.split(",") if s]
    info = describe_machine("bench_io", ("torchrl", "tensordict", "h5py"))
    env = dict(os.environ)
    src = args.zreplay_src or (HERE.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), env.get("PYTHONPATH", "")])
    env["ZREPLAY_BENCH_DIR"] = str(HERE)
    info["zreplay_src"] = str(src)
    wdir = Path(tempfile.mkdtemp(prefix="bench_io-", dir=args.tmpdir))
    print(f"workdir {wdir}; zreplay from {src}", flush=True)
    t_all = time.perf_counter()
    R: dict = {"config": cfg, "machine": info, "sections": {}, "load": []}
    log = R["load"]
    try:
        save_pool(wdir)
        buf = wdir / "img"
        build = subprocess.run(
            [sys.executable, "-c", BUILD, str(wdir), str(buf), str(cfg["traj"])],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        R["build"] = json.loads(build.stdout.strip().splitlines()[-1])
        for section in only:
            meter = CpuMeter().start()
            print(f"[{section}]", flush=True)
            if section in ("clips", "gather"):
                R["sections"][section] = run(section, {"buf": str(buf), "cfg": cfg}, wdir, env, log)
            elif section == "dump":
                swm, exp = wdir / "swm", wdir / "exp"
                subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        BUILD_SWM,
                        str(wdir),
                        str(swm),
                        str(exp),
                        str(cfg["export_traj"]),
                    ],
                    env=env,
                    check=True,
                )
                rounds = []
                for r in range(cfg["dump_rounds"]):
                    sides = ("zreplay", "peer") if r % 2 == 0 else ("peer", "zreplay")
                    got = {}
                    for side in sides:
                        job = {
                            "side": side,
                            "round": r,
                            "cfg": cfg,
                            "swm": str(swm),
                            "exp": str(exp),
                        }
                        got[side] = run("dump", job, wdir, env, log)
                    rounds.append(got)
                R["sections"]["dump"] = {"rounds": rounds}
            elif section == "ckpt":
                ensure_rlinf(args.rlinf_env)
                ck_z, ck_r = wdir / "ckpt_z", wdir / "ckpt_r"
                subprocess.run(
                    [sys.executable, "-c", CKPT_Z, str(buf), str(ck_z)], env=env, check=True
                )
                base = {"cfg": cfg, "rlinf_env": str(args.rlinf_env.resolve())}
                run(
                    "ckpt",
                    {
                        **base,
                        "side": "rlinf",
                        "round": -1,
                        "build": True,
                        "src": str(wdir / "rl_src"),
                        "ckpt": str(ck_r),
                    },
                    wdir,
                    env,
                    log,
                )
                rounds = []
                for r in range(cfg["ckpt_rounds"]):
                    sides = ("zreplay", "rlinf") if r % 2 == 0 else ("rlinf", "zreplay")
                    got = {}
                    for side in sides:
                        ck = ck_z if side == "zreplay" else ck_r
                        got[side] = run(
                            "ckpt",
                            {**base, "side": side, "round": r, "ckpt": str(ck)},
                            wdir,
                            env,
                            log,
                        )
                    rounds.append(got)
                R["sections"]["ckpt"] = {"rounds": rounds}
            R["sections"].setdefault(section, {})["section_load"] = meter.stop()
    finally:
        shutil.rmtree(wdir, ignore_errors=True)
    R["total_s"] = time.perf_counter() - t_all
    R["loadavg_end"] = os.getloadavg()
    table, summary = build_table(R)
    R["summary"] = summary
    print(table)
    write_json(args.out, R)
    return 0


BUILD = r"""
import json, os, sys, time
sys.path.insert(0, os.environ["ZREPLAY_BENCH_DIR"])
from pathlib import Path
import zreplay
import bench_io as b
wdir, path, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
t0 = time.perf_counter()
b.build_rlinf_like(zreplay, path, b.load_pool(wdir), n)
print(json.dumps({"seconds": time.perf_counter() - t0, "zreplay": zreplay.__file__}))
"""

BUILD_SWM = r"""
import os, sys
sys.path.insert(0, os.environ["ZREPLAY_BENCH_DIR"])
from pathlib import Path
import zreplay
import bench_io as b
wdir, swm, exp, n = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
rb = zreplay.ReplayBuffer(max_steps=10_000, path=swm)
for e in b.load_swm(wdir):
    rb.write_episode(e)
rb.close()
b.build_rlinf_like(zreplay, exp, b.load_pool(wdir), n)
"""

CKPT_Z = r"""
import sys
import zreplay
b = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=sys.argv[1])
b.save_checkpoint(sys.argv[2])
b.close()
"""


def _med(values) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.median(v)) if v else None


def build_table(R: dict) -> tuple[str, dict]:
    t = WorkloadTable()
    summary: dict = {}
    S = R["sections"]
    c = S.get("clips", {}).get("figures")
    if c:
        trl = [v for k, v in c.items() if k.startswith("TorchRL")]
        peer = min(v["median_s"] for v in trl)  # the faster of its thread settings
        fig = "32 clips x 8, images, disk"
        for name, d in c.items():
            if name.startswith("decode"):
                t.add(fig, f"{name} ({d['chunks']} chunks)", d["median_s"], d["p90_s"])
                continue
            r = ratio(d["median_s"], peer) if name.startswith("zreplay view") else None
            if "Prioritized" in name:
                r = None
            t.add(fig, name, d["median_s"], d["p90_s"], r, "this / faster TorchRL" if r else "")
            summary[f"clips: {name}"] = d["median_s"]
        summary["clips: zreplay view / TorchRL memmap"] = ratio(c["zreplay view"]["median_s"], peer)
    g = S.get("gather", {}).get("figures")
    if g:
        peer = g["raw TensorStore gather"]["median_s"]
        fig = "sample(256) disk, RAM tier off"
        for name, d in g.items():
            r = None if name.startswith(("raw", "decode")) else ratio(d["median_s"], peer)
            t.add(fig, name, d["median_s"], d["p90_s"], r, "this / raw TS" if r else "")
        summary["gather: zreplay / raw TS"] = ratio(
            g["zreplay sample(256), enable_cache=False"]["median_s"], peer
        )
    d = S.get("dump", {}).get("rounds")
    if d:
        z = {k: _med(r["zreplay"].get(k) for r in d) for k in d[0]["zreplay"] if k != "error"}
        p = {k: _med(r["peer"].get(k) for r in d) for k in d[0]["peer"] if k != "error"}
        fig = "dump / export"
        mb = 79.0
        for name, v in z.items():
            if name.startswith("bytes"):
                continue
            peer_v = p["plain h5py write"] if "hdf5" in name else p.get("torch.save loop")
            r = ratio(v, peer_v) if ("hdf5" in name or "pt" in name) else None
            t.add(fig, f"zreplay {name}", v, None, r, "this / peer" if r else "")
        for name, v in p.items():
            if not name.startswith("bytes"):
                t.add(fig, f"peer {name}", v, None)
        summary["dump hdf5 / plain h5py"] = ratio(
            z["ReplayBuffer.dump hdf5"], p["plain h5py write"]
        )
        summary["dump hdf5 MB/s"] = mb / z["ReplayBuffer.dump hdf5"]
        summary["plain h5py MB/s"] = mb / p["plain h5py write"]
        summary["export pt / torch.save loop"] = ratio(
            z["TrajectoryReplayBuffer.export pt"], p["torch.save loop"]
        )
        summary["export pt / torch.save loop + fsync"] = ratio(
            z["TrajectoryReplayBuffer.export pt"], p["torch.save loop + fsync"]
        )
    k = S.get("ckpt", {}).get("rounds")
    if k:
        fig = "load_checkpoint, RLinf workload"
        zl = [r["zreplay"].get("load") for r in k]
        rl = [r["rlinf"].get("load") for r in k]
        t.add(
            fig,
            "zreplay load_checkpoint",
            _med(zl),
            None,
            ratio(_med(zl), _med(rl)),
            "this / RLinf",
        )
        t.add(fig, "RLinf 0.3 load_checkpoint", _med(rl), None)
        keys = ("first sample(256)", "RAM tier full again (from the load call)")
        keys += ("tensorstore import (once per process, not in load)",)
        for key in keys:
            zs = [r["zreplay"].get(key) for r in k]
            t.add(fig, f"zreplay {key}", _med(zs), None)
        t.add(
            fig,
            "RLinf first sample(256)",
            _med(r["rlinf"].get("first sample(256)") for r in k),
            None,
        )
        summary["load_checkpoint / RLinf"] = ratio(_med(zl), _med(rl))
        summary["load_checkpoint per-round ratios"] = [
            ratio(a, b) for a, b in zip(zl, rl, strict=True)
        ]
    lines = [t.text(), "", "summary (same-run ratios, zreplay / peer):"]
    lines += [
        f"  {k}: {v:.3g}" if isinstance(v, float) else f"  {k}: {v}" for k, v in summary.items()
    ]
    foreign = [x["foreign_cpu_cores"] for x in R["load"]]
    if foreign:
        lines.append(
            f"other processes' CPU during the children: median {np.median(foreign):.2f}, "
            f"max {max(foreign):.2f} cores; load average at the end {R.get('loadavg_end')}"
        )
    return "\n".join(lines), summary


if __name__ == "__main__":
    sys.exit(main())
