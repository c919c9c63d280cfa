"""Helpers shared by the benchmark scripts: timing statistics, file walks, the peer read
paths over zreplay's own arrays, machine facts and CPU metering, child processes, and the
result tables.

The benchmark scripts import this module and no other bench script; it imports none of
them, nor zreplay or torch, so benchmark children that load it start fast.
"""

from __future__ import annotations

import atexit
import datetime
import importlib.metadata
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

# Column cache files of the buffers a benchmark makes go to a directory of this run,
# removed at its end (child processes inherit it), not to the user's ~/.cache, where
# an hour of runs left gigabytes of files of buffers long deleted.
if "ZREPLAY_CACHE_DIR" not in os.environ:
    os.environ["ZREPLAY_CACHE_DIR"] = tempfile.mkdtemp(prefix="zreplay-bench-cols-")
    atexit.register(shutil.rmtree, os.environ["ZREPLAY_CACHE_DIR"], True)


def zarr_and_tensorstore_gathers(
    path: Path, keys: list[str], n_rows: int, rng: np.random.Generator, sample_n: int
) -> tuple[Callable[[], dict], Callable[[], dict]]:
    """``(zarr_gather, ts_gather)``: each draws ``sample_n`` uniform rows of a zreplay buffer
    at ``path`` (segment ``default``) and reads every key the way a careful user would:
    zarr-python one ``oindex`` per key, raw TensorStore with every key's read issued before
    waiting; both on sorted unique rows, then scattered back with the inverse indices."""
    import tensorstore as ts
    import zarr

    g = zarr.open_group(str(path), mode="r")
    zarrs = {k: g[f"segments/default/data/{k}"] for k in keys}
    stores = {
        k: ts.open(
            {
                "driver": "zarr3",
                "kvstore": {
                    "driver": "file",
                    "path": str(Path(path) / "segments/default/data" / k),
                },
            }
        ).result()
        for k in keys
    }

    def zarr_gather():
        idx = rng.integers(0, n_rows, sample_n)
        uniq, inv = np.unique(idx, return_inverse=True)
        return {k: a.oindex[uniq][inv] for k, a in zarrs.items()}

    def ts_gather():
        idx = rng.integers(0, n_rows, sample_n)
        uniq, inv = np.unique(idx, return_inverse=True)
        futs = {k: s[uniq].read() for k, s in stores.items()}
        return {k: f.result()[inv] for k, f in futs.items()}

    return zarr_gather, ts_gather


def stats(seconds: list[float]) -> dict:
    """Median, p90, min, mean and count of durations in seconds."""
    a = np.asarray(seconds, np.float64)
    return {
        "median_s": float(np.median(a)),
        "p90_s": float(np.percentile(a, 90)),
        "min_s": float(a.min()),
        "mean_s": float(a.mean()),
        "n": int(len(a)),
    }


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def major_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def repeat(fn, repeats: int, warmup: int = 2) -> dict:
    """Stats of ``fn()`` over ``repeats`` calls after ``warmup`` untimed calls,
    plus the minor page faults per call (fresh pages touched: on this VM ~2 us each)
    and the major ones (pages read back from disk: what makes a mapped read slow when
    the page cache dropped its file)."""
    for _ in range(warmup):
        fn()
    out = []
    f0, m0 = minor_faults(), major_faults()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return {
        **stats(out),
        "minflt_per_call": (minor_faults() - f0) / repeats,
        "majflt_per_call": (major_faults() - m0) / repeats,
    }


def files_under(paths) -> list[str]:
    out = []
    for p in paths:
        p = str(p)
        if os.path.isfile(p):
            out.append(p)
            continue
        for dirpath, _dirs, files in os.walk(p):
            out.extend(os.path.join(dirpath, f) for f in files)
    return out


def dir_bytes(path) -> int:
    """Apparent size of every file under ``path``."""
    total = 0
    for f in files_under([path]):
        try:
            total += os.path.getsize(f)
        except FileNotFoundError:
            pass
    return total


def warm_page_cache(path) -> int:
    """Read every file under ``path`` once; returns the bytes read."""
    n = 0
    for f in files_under([path]):
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                n += len(chunk)
    return n


def nest(flat: dict) -> dict:
    """``{"a/b": v}`` -> ``{"a": {"b": v}}`` (zreplay and TensorDict take nested dicts)."""
    out: dict = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def copy_tree(tree: dict) -> dict:
    return {k: copy_tree(v) if isinstance(v, dict) else v.copy() for k, v in tree.items()}


# -- machine and CPU metering -----------------------------------------------------------


def machine_info() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    versions = {}
    for pkg in ("zreplay", "zarr", "tensorstore", "numpy", "torch", "numcodecs"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()

    def git(*a: str) -> str | None:
        try:
            r = subprocess.run(
                ["git", "-C", str(HERE.parent), *a], capture_output=True, text=True, check=False
            )
        except OSError:
            return None
        return r.stdout.strip()

    return {
        # benchmarks/report.py names each figure's commit and machine and keeps the newest run
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git": {"head": git("rev-parse", "HEAD"), "dirty_src": git("status", "--porcelain", "src")},
        "cpu_model": cpu,
        "cores": cores,
        "cpu_count": os.cpu_count(),
        "mem_total_gib": None if mem_kb is None else round(mem_kb / 2**20, 1),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": versions,
    }


class CpuMeter:
    """Wall time of a section and the CPU other processes used meanwhile (in cores).

    Another process busy on this 2-core machine skews every figure; the JSON records it."""

    def __init__(self):
        self.hz = os.sysconf("SC_CLK_TCK")
        self.t = self.busy = self.own = 0.0

    @staticmethod
    def _busy_ticks() -> int:
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:8]]
        except OSError:
            return 0
        return v[0] + v[1] + v[2] + v[5] + v[6]  # user nice system irq softirq

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def start(self) -> CpuMeter:
        self.t, self.busy, self.own = time.perf_counter(), self._busy_ticks(), self._own()
        return self

    def stop(self) -> dict:
        wall = time.perf_counter() - self.t
        busy = (self._busy_ticks() - self.busy) / self.hz
        own = self._own() - self.own
        return {
            "wall_s": wall,
            "own_cpu_cores": own / wall,
            "foreign_cpu_cores": max(0.0, (busy - own) / wall),
        }


def proc_status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0])
    return out


def warm_allocator() -> None:
    """Put glibc malloc in the state of any process that has freed a large buffer.

    Until then glibc mmaps every allocation >= 128 KiB afresh, so each result array
    (e.g. 256 images = 3 MB) page-faults on every call (~1,500 faults, ~3 ms on this VM);
    freeing one large block raises the mmap threshold (to at most 32 MiB) and later
    results reuse heap memory.  Which state a child lands in otherwise depends on what it
    happened to free, so every child starts from the warm one."""
    block = np.ones(24 << 20, np.uint8)
    del block


def foreign_processes(limit: int = 5) -> list[dict]:
    """The processes (other than ours) using the most CPU right now, for the record."""
    try:
        import psutil
    except ImportError:
        return []
    me = os.getpid()
    procs = list(psutil.process_iter(["pid", "name", "cmdline"]))
    for p in procs:
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(0.5)
    out = []
    for p in procs:
        try:
            if p.pid == me:
                continue
            c = p.cpu_percent(None)
            if c > 5:
                cmd = " ".join(p.info.get("cmdline") or [])[:120] or p.info.get("name")
                out.append({"pid": p.pid, "cpu_percent": c, "cmd": cmd})
        except psutil.Error:
            pass
    return sorted(out, key=lambda d: -d["cpu_percent"])[:limit]


def wait_idle(max_s: float) -> dict:
    """Wait up to ``max_s`` for other processes to use <= 0.2 cores (1 s samples)."""
    t0 = time.perf_counter()
    while True:
        chk = CpuMeter().start()
        time.sleep(1.0)
        chk = chk.stop()
        if chk["foreign_cpu_cores"] <= 0.2 or time.perf_counter() - t0 >= max_s:
            break
    chk["waited_s"] = time.perf_counter() - t0
    chk["loadavg"] = os.getloadavg()
    if chk["foreign_cpu_cores"] > 0.2:
        chk["busy_processes"] = foreign_processes()
        print(
            f"  WARNING: other processes use {chk['foreign_cpu_cores']:.2f} cores "
            f"(waited {chk['waited_s']:.0f}s); figures will be noisy: "
            + "; ".join(f"{p['cmd'][:60]} {p['cpu_percent']:.0f}%" for p in chk["busy_processes"]),
            flush=True,
        )
    return chk


def describe_machine(title: str, extra_packages) -> dict:
    """Machine facts plus versions of ``extra_packages``; prints a one-line header."""
    info = machine_info()
    for pkg in extra_packages:
        try:
            info["versions"][pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            info["versions"][pkg] = None
    print(
        f"{title} on {info['cpu_model']}, {info['cores']} cores, "
        f"{info['mem_total_gib']} GiB, python {info['python']}, "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items()),
        flush=True,
    )
    return info


# -- child processes -------------------------------------------------------------------


def run_child_job(
    script: str, system: str, job: dict, wdir, env: dict | None = None
) -> tuple[dict, dict]:
    """Run ``python script --child job.json`` (the system measured in a fresh process);
    returns its JSON result (``{"error", "stderr_tail"}`` on failure) and the CPU section
    measured around it (``CpuMeter``: other processes' load meanwhile).  ``env``: the
    child's environment (default: this process's)."""
    tag = job.get("tag", system)
    job_path, out = Path(wdir) / f"job_{tag}.json", Path(wdir) / f"res_{tag}.json"
    job = {**job, "system": system, "wdir": str(wdir), "out": str(out)}
    job_path.write_text(json.dumps(job))
    out.unlink(missing_ok=True)
    meter = CpuMeter().start()
    r = subprocess.run(
        [sys.executable, str(Path(script).resolve()), "--child", str(job_path)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    section = meter.stop()
    res = json.loads(out.read_text()) if out.exists() else {}
    if r.returncode != 0 or not res or "error" in res:
        res.setdefault("error", f"child exited {r.returncode} without a result")
        res["stderr_tail"] = r.stderr[-3000:]
        print(f"  {system}: ERROR {res['error']}\n{res.get('traceback', r.stderr[-1500:])}")
    return res, section


def run_undisturbed(system: str, run, args, cfg: dict, idle: dict, disturbed: dict, note=None):
    """``run() -> (result, section)`` after waiting for an idle machine; once more if other
    processes used more than ``cfg["retry_if_foreign_cores"]`` cores meanwhile (the
    disturbed first section is kept in ``disturbed``).  ``note(result)`` adds to the line."""
    for attempt in (0, 1):
        if args.wait_idle > 0:
            idle[system] = wait_idle(min(args.wait_idle, cfg["idle_each_s"]))
        t0 = time.perf_counter()
        res, sec = run()
        print(
            f"  {system:<15} {time.perf_counter() - t0:6.1f}s  (other processes "
            f"{sec['foreign_cpu_cores']:.2f} cores, child peak RSS "
            f"{res.get('process_peak_rss_mb', 0):.0f} MB{note(res) if note else ''})",
            flush=True,
        )
        if (
            attempt == 0
            and args.wait_idle > 0
            and sec["foreign_cpu_cores"] > cfg["retry_if_foreign_cores"]
        ):
            disturbed[system] = sec
            print(f"  {system}: disturbed by other processes; running it again")
            continue
        return res, sec


# The open-time child (bench_foundation, bench_peers): opens a buffer at argv[2] as a view
# or a writer (argv[1]; anything else only imports zreplay) and prints time and memory.
OPEN_CHILD = r"""
import json, resource, sys, time
import zreplay


def vmrss_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


mode, path = sys.argv[1], sys.argv[2]
rss0 = vmrss_kb()
t0 = time.perf_counter()
n = 0
if mode == "view":
    v = zreplay.open(path)
    n = v.num_trajectories
elif mode == "buffer":
    b = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path, enable_cache=False)
    n = len(b)
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rss1 = vmrss_kb()
if mode == "buffer":
    b.close()
print(json.dumps({"seconds": dt, "maxrss_kb": peak, "vmrss_delta_kb": rss1 - rss0, "n": n}))
"""


def run_child(mode: str, path: Path) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", OPEN_CHILD, mode, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise RuntimeError(f"open subprocess ({mode}) failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- formatting and result tables --------------------------------------------------------


def fmt_time(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s >= 1.0:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.0f} us"


def med(d: dict | None, key: str = "median_s") -> float | None:
    return None if not d or key not in d else d[key]


class WorkloadTable:
    COLS = f"{'figure':<30} {'system':<38} {'median':>10} {'p90':>10} {'ratio':>8}  vs"

    def __init__(self):
        self.rows: list[dict] = []

    def add(self, figure, system, median=None, p90=None, ratio=None, vs="", text=None, **data):
        self.rows.append(
            {
                "figure": figure,
                "system": system,
                "median": median,
                "p90": p90,
                "ratio": ratio,
                "vs": vs,
                "text": text,
                **data,
            }
        )

    @staticmethod
    def fmt(r: dict) -> str:
        if r["text"] is not None:
            m, p = r["text"]
        else:
            m, p = fmt_time(r["median"]), fmt_time(r["p90"])
            if r["median"] is None:
                m, p = "n/a", ""
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        return f"{r['figure']:<30} {r['system']:<38} {m:>10} {p:>10} {ratio:>8}  {r['vs']}"

    def text(self) -> str:
        out, last = [self.COLS, "-" * len(self.COLS)], None
        for r in self.rows:
            if last is not None and r["figure"] != last:
                out.append("")
            fig = r["figure"] if r["figure"] != last else ""
            out.append(self.fmt({**r, "figure": fig}))
            last = r["figure"]
        return "\n".join(out)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def write_json(path, result: dict, indent: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent, default=float))
    print(f"wrote {path}")


def sim_frames(rng: np.random.Generator, n: int, b: int, h: int = 64, w: int = 64) -> np.ndarray:
    """Simulator-like frames u8[n, b, h, w, 3]: per env a wall gradient over a flat table,
    two moving blocks, and small sensor noise on a quarter of the pixels (they compress
    ~2-3x with zstd-1)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    out = np.empty((n, b, h, w, 3), np.int16)
    for j in range(b):
        ph = rng.uniform(0, 2 * np.pi, 3)
        wall = np.stack(
            [100 + 40 * np.sin(x / w * np.pi + ph[c]) + 25 * y / h for c in range(3)], -1
        )
        table = rng.integers(50, 200, 3).astype(np.float32)
        base = np.where((y < rng.integers(20, 40))[..., None], wall, table)
        out[:, j] = np.rint(base).astype(np.int16)
        for _ in range(2):
            s = int(rng.integers(6, 14))
            col = rng.integers(0, 255, 3)
            p, v = rng.uniform(0, h - s, 2), rng.uniform(-2, 2, 2)
            for t in range(n):
                px, py = ((p + v * t) % (h - s)).astype(int)
                out[t, j, py : py + s, px : px + s] = col
    mask = rng.random((n, b, h, w, 1)) < 0.25
    out += mask * rng.integers(-3, 4, out.shape, dtype=np.int16)
    return np.clip(out, 0, 255).astype(np.uint8)


def rlinf_image_trajectory(
    seed: int, T: int = 50, B: int = 8, h: int = 64, w: int = 64, frames_of=None
) -> dict:
    """One RLinf-like embodied trajectory [T, B] as flat key paths: images
    (``frames_of(rng, T + 1, B, h, w)``, default ``sim_frames``), 16-d states, 28-d
    action chunks, rewards and flags (the last step ends every lane)."""
    rng = np.random.default_rng(seed)
    frames = (frames_of or sim_frames)(rng, T + 1, B, h, w)
    states = np.cumsum(rng.normal(0, 0.05, (T + 1, B, 16)), 0).astype(np.float32)
    dones = np.zeros((T, B, 4), bool)
    dones[-1] = True
    return {
        "actions": rng.standard_normal((T, B, 28), dtype=np.float32),
        "rewards": (rng.random((T, B, 4)) < 0.05).astype(np.float32),
        "dones": dones,
        "terminations": dones.copy(),
        "truncations": np.zeros_like(dones),
        "curr_obs/main_images": frames[:T].copy(),
        "curr_obs/states": states[:T].copy(),
        "next_obs/main_images": frames[1:].copy(),
        "next_obs/states": states[1:].copy(),
    }
