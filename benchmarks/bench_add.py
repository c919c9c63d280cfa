#!/usr/bin/env python
"""The add path and ingest: zreplay vs RLinf 0.3 on RLinf's workload, small-row adds, codecs.

    python benchmarks/bench_add.py                        # ~3-5 min here
    python benchmarks/bench_add.py --quick --out /tmp/add.json
    python benchmarks/bench_add.py --zreplay-src /tmp/base/src --out before.json
    python benchmarks/bench_add.py --only ingest --before-src /tmp/base/src   # side by side

Sections (each system in fresh child processes; rounds alternate which goes first):

* ``ingest``: RLinf's workload (bench_io's: 60 trajectories [50, 8], two 64x64x3 uint8
  image keys plus small columns), both buffers built with ``auto_save=True`` and
  defaults, ``add_trajectories`` called back to back with one trajectory each (inputs
  built before the clock starts: nested numpy dicts for zreplay, RLinf ``Trajectory``
  objects of tensors for RLinf).  Per call latency (median, p90), the time from the first
  add until everything is on disk (zreplay: ``close()``, which commits; RLinf:
  ``close(wait=True)``, which joins its save threads) and the bytes on disk.  Variants of
  zreplay (``staging_bytes``, image codec, ``durable=False``) run as extra sides.  The
  codec's own limit for that time: the workload's rows encoded in the layout zreplay
  recorded (its chunks, its codecs; numcodecs, one thread), divided by the cores.
  ``--before-src`` adds a side ``zreplay (before)``: the default zreplay from another
  tree's ``src/``, in the same rounds.  Each child also reports the CPU seconds (user +
  system) its process spent from the first add to on disk: on a shared machine a steadier
  figure than the wall clock.
* ``sac``: one SAC-like trajectory [1000, 10] (64-d obs and next_obs, 8-d actions,
  reward, done) per ``add_trajectories`` with RLinf's default ``cache_size=5`` after the
  ring wrapped, writer idle at each call (flush between, untimed), against
  ``{k: v.copy()}`` of the same arrays in a tight loop (cache-hot) - bench_peers' (a).
* ``codecs``: per-key codecs on the workload's frames (one 64x64x3 frame per chunk, as
  the default layout) and states (1024 rows per chunk): compressed bytes and single-thread
  encode/decode MB/s with numcodecs (the same libraries TensorStore links).

Machine load (``os.getloadavg`` before/after each child, other processes' CPU) is in the
JSON.  Nothing asserts on timings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_io as bio  # noqa: E402
from benchlib import (  # noqa: E402
    CpuMeter,
    copy_tree,
    describe_machine,
    dir_bytes,
    run_child_job,
    stats,
    warm_allocator,
    write_json,
)

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "latest" / "add.json"
SECTIONS = ("ingest", "sac", "codecs")
CONFIGS = {
    "default": {"traj": 60, "rounds": 3, "sac_adds": 30},
    "quick": {"traj": 20, "rounds": 1, "sac_adds": 10},
}
IMAGE_KEYS = ("curr_obs/main_images", "next_obs/main_images")
BEFORE = "zreplay (before)"  # the default zreplay of --before-src
# zreplay sides of the ingest section: name -> TrajectoryReplayBuffer keyword arguments
# (``layout_images``: a layout override applied to both image keys).
VARIANTS = {
    "zreplay": {},
    "zreplay staging_bytes=1 GiB": {"staging_bytes": 1 << 30},
    "zreplay staging_bytes=3 GiB": {"staging_bytes": 3 << 30},
    "zreplay staging_bytes=0": {"staging_bytes": 0},
    "zreplay zstd-1 images": {"layout_images": {"codec": "zstd", "level": 1}},
    "zreplay lz4 images": {"layout_images": {"codec": "lz4", "level": 1}},
    # the write path's floor: frames stored as they are (the bytes target not met)
    "zreplay uncompressed images": {"layout_images": {"codec": "none"}},
    "zreplay qoi images": {"layout_images": {"codec": "qoi"}},
    "zreplay rowdiff chunk_rows=8": {
        "layout_images": {"codec": "rowdiff", "level": 1, "chunk_rows": 8, "shard_rows": 256}
    },
    "zreplay durable=False": {"durable": False},
    # rowdiff encoding with imagecodecs' zstd, as where zstandard is not installed
    "zreplay without zstandard": {"hide_modules": ["zstandard"]},
}


def child_ingest(job: dict) -> dict:
    wdir, side = Path(job["wdir"]), job["side"]
    path = wdir / f"ingest_{job['tag']}"
    shutil.rmtree(path, ignore_errors=True)
    pool = bio.load_pool(wdir)
    n = job["cfg"]["traj"]
    if side == "rlinf":
        sys.path.insert(0, job["rlinf_env"])
        exec(bio.RLINF_CHILD_SETUP, {})
        from rlinf.data.replay_buffer import TrajectoryReplayBuffer

        items = [bio.rlinf_trajectory(pool[i % bio.POOL]) for i in range(n)]
        b = TrajectoryReplayBuffer(seed=1234, auto_save=True, auto_save_path=str(path))

        def finish():
            b.close(wait=True)
    else:
        if job.get("src"):  # another tree's zreplay (the "before" side)
            sys.path.insert(0, job["src"])
        kw = dict(VARIANTS.get(side, {}))
        for name in kw.pop("hide_modules", ()):
            sys.modules[name] = None  # its import now fails, as where it is not installed
        import zreplay

        lay = kw.pop("layout_images", None)
        if lay is not None:
            kw["layout"] = {k: lay for k in IMAGE_KEYS}
        items = [bio.nest(pool[i % bio.POOL]) for i in range(n)]
        b = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), **kw)
        finish = b.close
    os.sync()
    load0 = os.getloadavg()
    per_add = []
    cpu0 = os.times()
    t0 = time.perf_counter()
    for it in items:
        a = time.perf_counter()
        b.add_trajectories([it])
        per_add.append(time.perf_counter() - a)
    t_adds = time.perf_counter() - t0
    finish()
    t_disk = time.perf_counter() - t0
    cpu1 = os.times()
    out = {
        "cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
        "cpu_system_s": cpu1.system - cpu0.system,
        "add": stats(per_add),
        "adds_total_s": t_adds,
        "first add to on disk_s": t_disk,
        "disk_bytes": dir_bytes(path),
        "layout": _recorded_layout(path) if side != "rlinf" else None,
        "raw_bytes": sum(v.nbytes for i in range(n) for v in pool[i % bio.POOL].values()),
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg(),
    }
    shutil.rmtree(path, ignore_errors=True)
    return out


def _recorded_layout(path: Path) -> dict | None:
    """The layout a zreplay buffer records in its root's ``zarr.json`` (FORMAT.md)."""
    try:
        meta = json.loads((path / "zarr.json").read_text())
        return meta["attributes"]["zreplay"]["layout"]
    except (OSError, ValueError, KeyError):
        return None


def _numcodec(name: str, level: int, itemsize: int):
    """The numcodecs twin of a layout's codec (the libraries TensorStore links)."""
    from numcodecs import Blosc, Zstd

    if name == "zstd":
        return Zstd(level)
    if name == "lz4":
        shuffle = Blosc.SHUFFLE if itemsize > 1 else Blosc.BITSHUFFLE
        return Blosc("lz4", level, shuffle, blocksize=0)
    from zreplay.store.imagecodec import chunk_codec
    from zreplay.store.layout import IMAGE_CODECS

    if name in IMAGE_CODECS:  # zreplay's own image codecs (rowdiff, png, ...): array -> bytes
        fmt, knob, _, _, fixed = IMAGE_CODECS[name]
        config = {**fixed, **({knob: level} if knob else {})}

        class Frames:  # a chunk codec per chunk shape, made once, as the shard writer has
            codecs: dict = {}

            def encode(self, chunk):
                codec = self.codecs.get(chunk.shape)
                if codec is None:
                    codec = self.codecs[chunk.shape] = chunk_codec(fmt, config, chunk.shape)
                return codec.encode(chunk)

        return Frames()
    return None


def child_codec_limit(job: dict) -> dict:
    """What the ingest workload's encoding costs with the layout the buffer recorded:
    every key's rows, env-major as stored, cut into its ``chunk_rows`` chunks and encoded
    by the same codec on one thread (crc32c left out).  That time over the machine's
    cores is the codec's own limit for "everything on disk"."""
    from numcodecs import blosc

    blosc.set_nthreads(1)
    pool = bio.load_pool(Path(job["wdir"]))
    items = [pool[i % bio.POOL] for i in range(job["cfg"]["traj"])]
    raw, secs, per_key = 0, 0.0, {}
    for key, lay in job["layout"].items():
        rows = np.concatenate(
            [
                np.ascontiguousarray(np.swapaxes(it[key], 0, 1)).reshape(-1, *it[key].shape[2:])
                for it in items
            ]
        )
        codec = _numcodec(lay["codec"], lay["level"], rows.dtype.itemsize)
        n = lay["chunk_rows"]
        chunks = [rows[i : i + n] for i in range(0, len(rows), n)]
        if codec is not None:
            codec.encode(chunks[0])  # first-call setup out of the timing
        t0 = time.perf_counter()
        if codec is not None:
            for c in chunks:
                codec.encode(c)
        dt = time.perf_counter() - t0
        per_key[key] = {"raw_bytes": int(rows.nbytes), "encode_s": dt}
        raw += rows.nbytes
        secs += dt
    cores = os.cpu_count() or 1
    return {
        "raw_bytes": int(raw),
        "encode_s_one_thread": secs,
        "cores": cores,
        "limit_s": secs / cores,
        "per_key": per_key,
    }


def sac_trajectory(seed: int, T: int = 1000, B: int = 10) -> dict:
    """State vectors as random walks (bench_peers' SAC workload, one trajectory)."""
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.standard_normal((T + 1, B, 64), dtype=np.float32) * 0.05, axis=0)
    actions = np.tanh(np.cumsum(rng.standard_normal((T, B, 8), dtype=np.float32) * 0.2, 0))
    return {
        "obs": walk[:T].copy(),
        "next_obs": walk[1:].copy(),
        "actions": actions.astype(np.float32),
        "rewards": -np.square(walk[1:, :, :1]).astype(np.float32),
        "dones": np.zeros((T, B, 1), bool),
    }


def child_sac(job: dict) -> dict:
    import zreplay

    wdir = Path(job["wdir"])
    pool = [sac_trajectory(101 + i) for i in range(4)]
    path = wdir / "sac"
    shutil.rmtree(path, ignore_errors=True)
    b = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), sample_window_size=0, cache_size=5
    )
    for i in range(12):  # wrap the ring twice: every slot touched
        b.add_trajectories([pool[i % 4]])
        b.flush()
    adds = []
    for i in range(job["cfg"]["sac_adds"]):
        a = time.perf_counter()
        b.add_trajectories([pool[i % 4]])
        adds.append(time.perf_counter() - a)
        b.flush()
    b.close()
    shutil.rmtree(path, ignore_errors=True)
    copies = []
    for i in range(max(10, job["cfg"]["sac_adds"])):
        a = time.perf_counter()
        c = copy_tree(pool[i % 4])
        copies.append(time.perf_counter() - a)
        del c
    add, copy = stats(adds), stats(copies)
    return {"add": add, "copy": copy, "ratio": add["median_s"] / copy["median_s"]}


def _codec_row(codec, chunks: list[np.ndarray]) -> dict:
    raw = sum(c.nbytes for c in chunks)
    t0 = time.perf_counter()
    enc = [codec.encode(c) for c in chunks]
    t1 = time.perf_counter()
    for e in enc:
        codec.decode(e)
    t2 = time.perf_counter()
    size = sum(len(e) for e in enc)
    return {
        "bytes": size,
        "ratio": raw / size,
        "encode_MBps": raw / (t1 - t0) / 1e6,
        "decode_MBps": raw / (t2 - t1) / 1e6,
    }


def child_codecs(job: dict) -> dict:
    from numcodecs import LZ4, Blosc, Zstd, blosc

    blosc.set_nthreads(1)  # single-thread figures (TensorStore encodes chunks in parallel)
    pool = bio.load_pool(Path(job["wdir"]))
    frames = np.concatenate([p["curr_obs/main_images"] for p in pool], 1)
    frames = np.ascontiguousarray(frames.swapaxes(0, 1)).reshape(-1, bio.H, bio.W, 3)
    states = np.concatenate([p["curr_obs/states"] for p in pool], 1)
    states = np.ascontiguousarray(states.swapaxes(0, 1)).reshape(-1, 16)
    frame_chunks = list(frames)
    state_chunks = [states[i : i + 1024] for i in range(0, len(states), 1024)]
    bit, byte, no = Blosc.BITSHUFFLE, Blosc.SHUFFLE, Blosc.NOSHUFFLE
    image_codecs = {
        "zstd-1": Zstd(1),
        "zstd-3": Zstd(3),
        "lz4 (numcodecs.LZ4)": LZ4(1),
        "blosc-lz4-5 noshuffle": Blosc("lz4", 5, no),
        "blosc-lz4-1 noshuffle": Blosc("lz4", 1, no),
        "blosc-lz4-5 bitshuffle": Blosc("lz4", 5, bit),
        "blosc-zstd-1 bitshuffle": Blosc("zstd", 1, bit),
    }
    state_codecs = {
        "zstd-1": Zstd(1),
        "blosc-lz4-5 shuffle": Blosc("lz4", 5, byte),
        "blosc-zstd-1 shuffle": Blosc("zstd", 1, byte),
        "blosc-lz4-5 noshuffle": Blosc("lz4", 5, no),
    }
    for c in (*image_codecs.values(), *state_codecs.values()):
        c.encode(frame_chunks[0])  # first-call setup out of the timing
    return {
        "images": {k: _codec_row(c, frame_chunks) for k, c in image_codecs.items()},
        "states": {k: _codec_row(c, state_chunks) for k, c in state_codecs.items()},
        "image_raw_bytes": int(frames.nbytes),
        "state_raw_bytes": int(states.nbytes),
    }


CHILDREN = {
    "ingest": child_ingest,
    "codec_limit": child_codec_limit,
    "sac": child_sac,
    "codecs": child_codecs,
}


def child_main(job_path: Path) -> int:
    job = json.loads(job_path.read_text())
    warm_allocator()
    try:
        res = CHILDREN[job["section"]](job)
    except Exception as e:  # noqa: BLE001 - reported to the parent
        res = {"error": repr(e), "traceback": traceback.format_exc()}
    Path(job["out"]).write_text(json.dumps(res, default=float))
    return 0


def _med(rounds: list[dict], side: str, *path) -> float | None:
    vals = []
    for r in rounds:
        v = r.get(side, {})
        for p in path:
            v = v.get(p) if isinstance(v, dict) else None
        if isinstance(v, (int, float)):
            vals.append(v)
    return float(np.median(vals)) if vals else None


def build_table(R: dict) -> tuple[str, dict]:
    lines, summary = [], {}
    ing = R["sections"].get("ingest", {}).get("rounds")
    if ing:
        lines.append(
            f"{'ingest, RLinf workload':<32} {'add med':>9} {'add p90':>9} "
            f"{'to disk':>9} {'cpu s':>7} {'disk MB':>9}"
        )
        for side in ing[0]:
            med = _med(ing, side, "add", "median_s")
            p90 = _med(ing, side, "add", "p90_s")
            disk = _med(ing, side, "first add to on disk_s")
            size = _med(ing, side, "disk_bytes")
            cpu = _med(ing, side, "cpu_s")
            if med is None:
                lines.append(f"{side:<32} ERROR")
                continue
            lines.append(
                f"{side:<32} {med * 1e3:7.1f}ms {p90 * 1e3:7.1f}ms {disk:8.2f}s "
                f"{cpu or float('nan'):7.2f} {size / 1e6:9.1f}"
            )
            summary[side] = {"add_median_s": med, "add_p90_s": p90, "to_disk_s": disk}
            if cpu is not None:
                summary[side]["cpu_s"] = cpu
            summary[side]["disk_bytes"] = size
        lim = R["sections"]["ingest"].get("codec_limit") or {}
        if "limit_s" in lim:
            summary["codec limit_s"] = lim["limit_s"]
            lines.append(
                f"codec limit: {lim['raw_bytes'] / 1e6:.0f} MB encoded in "
                f"{lim['encode_s_one_thread']:.2f} s on one thread, {lim['limit_s']:.2f} s "
                f"on {lim['cores']} cores"
            )
        rl = summary.get("rlinf")
        for side, s in list(summary.items()):
            if side == "codec limit_s":
                continue
            if "limit_s" in lim:
                s["to_disk / codec limit"] = s["to_disk_s"] / lim["limit_s"]
            if rl and side != "rlinf":
                s["add_median / rlinf"] = s["add_median_s"] / rl["add_median_s"]
                s["to_disk / rlinf"] = s["to_disk_s"] / rl["to_disk_s"]
                s["rlinf bytes / these"] = rl["disk_bytes"] / s["disk_bytes"]
                if "cpu_s" in s and rl.get("cpu_s"):
                    s["cpu / rlinf"] = s["cpu_s"] / rl["cpu_s"]
                limit = s.get("to_disk / codec limit")
                lines.append(
                    f"  {side} / RLinf: add median {s['add_median / rlinf']:.2f}x, to disk "
                    f"{s['to_disk / rlinf']:.2f}x, RLinf bytes {s['rlinf bytes / these']:.2f}x"
                    + ("" if limit is None else f"; to disk / codec limit {limit:.2f}x")
                    + ("" if "cpu / rlinf" not in s else f"; cpu {s['cpu / rlinf']:.2f}x")
                )
    sac = R["sections"].get("sac", {}).get("rounds")
    if sac:
        ratios = [r["zreplay"]["ratio"] for r in sac if "ratio" in r.get("zreplay", {})]
        add = _med(sac, "zreplay", "add", "median_s")
        cp = _med(sac, "zreplay", "copy", "median_s")
        if ratios:
            summary["sac add / copy"] = float(np.median(ratios))
            lines.append(
                f"SAC [1000,10] add {add * 1e6:.0f} us, copy {cp * 1e6:.0f} us: "
                f"{summary['sac add / copy']:.2f}x (rounds: "
                + ", ".join(f"{x:.2f}" for x in ratios)
                + ")"
            )
    cod = R["sections"].get("codecs", {}).get("result")
    if cod and "images" in cod:
        for kind in ("images", "states"):
            lines.append(f"{kind:<26} {'ratio':>7} {'enc MB/s':>9} {'dec MB/s':>9}")
            for name, row in cod[kind].items():
                lines.append(
                    f"  {name:<24} {row['ratio']:7.2f} {row['encode_MBps']:9.0f} "
                    f"{row['decode_MBps']:9.0f}"
                )
    return "\n".join(lines), summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--variants", default=",".join(VARIANTS), help="zreplay ingest sides")
    ap.add_argument("--tmpdir", type=Path, default=None)
    ap.add_argument("--zreplay-src", type=Path, default=None, help="a tree's src/ to measure")
    ap.add_argument(
        "--before-src", type=Path, default=None, help="ingest: another tree's src/, side by side"
    )
    ap.add_argument("--rlinf-env", type=Path, default=HERE / ".rlinf-env")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(args.child)
    cfg = CONFIGS["quick" if args.quick else "default"]
    only = [s for s in args.only.split(",") if s]
    info = describe_machine("bench_add", ("tensorstore", "numcodecs"))
    env = dict(os.environ)
    src = args.zreplay_src or (HERE.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), env.get("PYTHONPATH", "")])
    env["ZREPLAY_BENCH_DIR"] = str(HERE)
    info["zreplay_src"] = str(src)
    if args.before_src:
        info["before_src"] = str(args.before_src.resolve())
    wdir = Path(tempfile.mkdtemp(prefix="bench_add-", dir=args.tmpdir))
    print(f"workdir {wdir}; zreplay from {src}", flush=True)
    t_all = time.perf_counter()
    R: dict = {"config": cfg, "machine": info, "sections": {}, "load": []}
    R["loadavg_start"] = os.getloadavg()

    def run(section: str, job: dict) -> dict:
        job = {**job, "section": section, "cfg": cfg}
        job["tag"] = f"{section}_{job.get('side', '')}_{job.get('round', 0)}".replace(" ", "_")
        job["tag"] = "".join(c for c in job["tag"] if c.isalnum() or c in "_-")
        res, sec = run_child_job(__file__, section, job, wdir, env)
        R["load"].append({"section": section, "side": job.get("side"), **sec})
        return res

    try:
        bio.save_pool(wdir)
        for section in only:
            meter = CpuMeter().start()
            print(f"[{section}]", flush=True)
            if section == "ingest":
                bio.ensure_rlinf(args.rlinf_env)
                sides = ["rlinf", *[v for v in args.variants.split(",") if v]]
                if args.before_src:
                    sides.insert(1, BEFORE)
                rounds = []
                for r in range(cfg["rounds"]):
                    order = sides if r % 2 == 0 else sides[::-1]
                    got = {}
                    for side in order:
                        job = {"side": side, "round": r}
                        job["rlinf_env"] = str(args.rlinf_env.resolve())
                        if side == BEFORE:
                            job["src"] = str(args.before_src.resolve())
                        got[side] = run("ingest", job)
                    rounds.append({s: got[s] for s in sides})
                R["sections"]["ingest"] = {"rounds": rounds}
                layout = next((g.get("layout") for g in got.values() if g.get("layout")), None)
                if layout:
                    R["sections"]["ingest"]["codec_limit"] = run("codec_limit", {"layout": layout})
            elif section == "sac":
                rounds = [{"zreplay": run("sac", {"round": r})} for r in range(cfg["rounds"])]
                R["sections"]["sac"] = {"rounds": rounds}
            elif section == "codecs":
                R["sections"]["codecs"] = {"result": run("codecs", {})}
            R["sections"][section]["section_load"] = meter.stop()
    finally:
        shutil.rmtree(wdir, ignore_errors=True)
    R["total_s"] = time.perf_counter() - t_all
    R["loadavg_end"] = os.getloadavg()
    table, summary = build_table(R)
    R["summary"] = summary
    print(table)
    print(f"load average start {R['loadavg_start']}, end {R['loadavg_end']}")
    write_json(args.out, R)
    return 0


if __name__ == "__main__":
    sys.exit(main())
