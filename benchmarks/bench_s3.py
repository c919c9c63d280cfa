"""S3 against local disk: view sampling, fetch-all, writer ingest, requests per sample.

The dataset of issue 15: 20 trajectories [50, 8] with 64x64x3 uint8 images (a smooth wall,
a floor, a moving square, sensor noise on 10% of pixels: ~2.3x with zstd-1), float32
states [16], actions [7] and rewards [1]; zreplay's default layout (32 image shard objects
of 256 rows).  Every figure of one server comes from the same run against the same
server:

* ingest: ``add_trajectories`` of the 20 trajectories one by one, then ``flush()``, into a
  new buffer on S3 and on local disk (commits and requests counted);
* ``zreplay.open(url).sample(256)``: median of 20 timed samples after 2 warm-up ones (and
  the first sample of a fresh view, "cold");
* fetch-all: GET every image shard object at once (zreplay's obstore client, and s3fs's
  ``cat`` as the issue measured it): what downloading everything costs;
* the same ``sample(256)`` of the local copy;
* "steady": both views again after ``STEADY_DRAWS`` more untimed samples each, as a view
  that has been sampling for a while (its column cache file and chunk cache hold what it
  drew: 150 x 256 draws of 8,000 rows leave ~1% undrawn).

Servers: moto's S3 server in its own process on 127.0.0.1 (with a request counter), and the
same with 20 ms added before every response (``--latency-ms``; requests overlap, as on
S3).  moto spends ~2 ms of serialized Python per request, so there the request count sets
the cost.

    python benchmarks/bench_s3.py              # both servers, ~2 min
    python benchmarks/bench_s3.py --latency-ms 0 --samples 10
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
from benchlib import machine_info

# Column cache files of the buffers this benchmark makes: a directory of this run,
# removed at its end (children inherit it), not the user's ~/.cache.
if "ZREPLAY_CACHE_DIR" not in os.environ:
    os.environ["ZREPLAY_CACHE_DIR"] = tempfile.mkdtemp(prefix="zreplay-bench-cols-")
    atexit.register(shutil.rmtree, os.environ["ZREPLAY_CACHE_DIR"], True)

HERE = Path(__file__).resolve().parent
N_TRAJ, T, B, H = 20, 50, 8, 64
STEADY_DRAWS = 150  # untimed samples before the "steady" figures (~99% of rows drawn)


# -- the server (run as a child process: --serve PORTFILE LATENCY_MS) --------------------


def serve(portfile: str, latency_ms: float) -> None:
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    counts: Counter = Counter()
    lock = threading.Lock()
    inner = DomainDispatcherApplication(create_backend_app)

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path in ("/__stats", "/__reset"):
            with lock:
                body = json.dumps(dict(counts)).encode()
                if path == "/__reset":
                    counts.clear()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        if latency_ms:
            time.sleep(latency_ms / 1000)
        method, qs = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
        kind = method
        if method == "GET" and environ.get("HTTP_RANGE"):
            kind = "GET-range"
        elif method == "GET" and ("list-type" in qs or "prefix" in qs or "delimiter" in qs):
            kind = "LIST"
        body = list(inner(environ, start_response))
        with lock:
            counts[kind] += 1
            counts["requests"] += 1
            counts["bytes_out"] += sum(len(b) for b in body)
            counts["bytes_in"] += int(environ.get("CONTENT_LENGTH") or 0)
        return body

    class Server(ThreadedMotoServer):
        def _server_entry(self) -> None:
            self._server = make_server(
                self._ip_address, self._port, app, True, request_handler=MotoRequestHandler
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    s = Server(ip_address="127.0.0.1", port=0, verbose=False)
    s.start()
    Path(portfile).write_text(str(s.get_host_and_port()[1]))
    threading.Event().wait()


class Moto:
    def __init__(self, latency_ms: float, tmp: Path):
        portfile = tmp / f"port-{latency_ms}"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(portfile), str(latency_ms)]
        )
        for _ in range(400):
            if portfile.exists() and portfile.read_text():
                break
            time.sleep(0.05)
        self.endpoint = f"http://127.0.0.1:{portfile.read_text()}"
        self.options = {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing"}

    def counts(self, reset: bool = False) -> dict:
        with urllib.request.urlopen(self.endpoint + ("/__reset" if reset else "/__stats")) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# -- the dataset ------------------------------------------------------------------------


def make_traj(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:H].astype(np.float32)
    img = np.empty((T, B, H, H, 3), np.uint8)
    for b in range(B):
        ph = rng.uniform(0, 2 * np.pi)
        base = np.stack(
            [np.rint(100 + 30 * np.sin(x / H * np.pi + ph + c) + 20 * y / H) for c in range(3)], -1
        )
        base[int(rng.integers(30, 50)) :] = rng.integers(40, 200, 3)
        pos, vel, col = rng.integers(0, H - 12, 2), rng.integers(-2, 3, 2), rng.integers(0, 256, 3)
        for t in range(T):
            f = base.copy()
            py, px = (pos + vel * t) % (H - 12)
            f[py : py + 12, px : px + 12] = col
            noise = rng.random((H, H, 1)) < 0.1
            f = np.where(noise, f + np.rint(rng.normal(0, 2, (H, H, 3))), f)
            img[t, b] = np.clip(f, 0, 255)
    return {
        "actions": rng.standard_normal((T, B, 7), dtype=np.float32),
        "rewards": rng.random((T, B, 1), dtype=np.float32),
        "curr_obs": {
            "main_images": img,
            "states": np.cumsum(rng.normal(0, 0.1, (T, B, 16)), 0).astype(np.float32),
        },
    }


# -- measurements -----------------------------------------------------------------------


def ingest(path: str, options, trajs) -> tuple[float, int]:
    import zreplay

    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, storage_options=options
    )
    t0 = time.perf_counter()
    for t in trajs:
        buf.add_trajectories([t])
    buf.flush()
    took = time.perf_counter() - t0
    gen = buf.core.engine.commit.gen
    buf.close()
    return took, gen


def timed(fn, n: int, warm: int = 2) -> dict:
    for _ in range(warm):
        fn()
    walls = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    return {
        "median_ms": 1e3 * float(np.median(walls)),
        "p90_ms": 1e3 * float(np.quantile(walls, 0.9)),
    }


def run_server(latency_ms: float, trajs, local: str, tmp: Path, samples: int) -> dict:
    import s3fs

    import zreplay
    from zreplay.store.location import locate

    moto = Moto(latency_ms, tmp)
    try:
        opts = moto.options
        s3fs.S3FileSystem(**opts).mkdir("bench")
        url = "s3://bench/buf"
        moto.counts(reset=True)
        s3_ingest, s3_commits = ingest(url, opts, trajs)
        ingest_requests = moto.counts(reset=True)

        t0 = time.perf_counter()
        view = zreplay.open(url, storage_options=opts)
        open_ms = 1e3 * (time.perf_counter() - t0)
        open_requests = moto.counts(reset=True)
        t0 = time.perf_counter()
        view.sample(256)
        cold_ms = 1e3 * (time.perf_counter() - t0)
        cold_requests = moto.counts(reset=True)["requests"]
        for _ in range(2):
            view.sample(256)
        moto.counts(reset=True)
        s3 = timed(lambda: view.sample(256), samples, warm=0)
        per = moto.counts(reset=True)
        per_sample = {k: round(v / samples, 1) for k, v in per.items()}

        backend = locate(url, opts).backend
        prefix = "buf/segments/default/data/curr_obs/main_images/c/"
        shards = sorted(k for k, _ in backend.list(prefix, recursive=True)[0])
        nbytes = sum(len(b) for b in backend.get([(k, None) for k in shards]))
        fetch = timed(lambda: backend.get([(k, None) for k in shards]), 5, warm=1)
        fs = s3fs.S3FileSystem(**opts)
        cat = timed(lambda: fs.cat([f"bench/{k}" for k in shards]), 5, warm=1)
        lview = zreplay.open(local)
        loc = timed(lambda: lview.sample(256), samples)
        # A view that has been sampling for a while: its caches hold what it drew.
        for _ in range(STEADY_DRAWS):
            view.sample(256)
            lview.sample(256)
        moto.counts(reset=True)
        s3_steady = timed(lambda: view.sample(256), samples, warm=0)
        steady_per = moto.counts(reset=True)
        loc_steady = timed(lambda: lview.sample(256), samples, warm=0)
        out = {
            "latency_ms": latency_ms,
            "s3_sample": s3,
            "s3_cold_sample_ms": cold_ms,
            "s3_cold_sample_requests": cold_requests,
            "s3_open_ms": open_ms,
            "s3_open_requests": open_requests,
            "requests_per_sample": per_sample,
            "image_shards": len(shards),
            "image_shard_mb": nbytes / 1e6,
            "fetch_all_obstore": fetch,
            "fetch_all_s3fs_cat": cat,
            "local_sample": loc,
            "s3_sample_steady": s3_steady,
            "requests_per_sample_steady": {k: round(v / samples, 1) for k, v in steady_per.items()},
            "local_sample_steady": loc_steady,
            "s3_ingest_s": s3_ingest,
            "s3_ingest_commits": s3_commits,
            "s3_ingest_requests": ingest_requests,
        }
        return out
    finally:
        moto.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--latency-ms", type=float, nargs="*", default=[0, 20])
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--out", default=str(HERE / "results" / "latest" / "s3.json"))
    args = ap.parse_args()
    if args.serve:
        serve(args.serve[0], float(args.serve[1]))
        return
    load0 = os.getloadavg()
    trajs = [make_traj(i) for i in range(N_TRAJ)]
    tmp = Path(tempfile.mkdtemp(prefix="zreplay-bench-s3-"))
    try:
        local = str(tmp / "local")
        local_ingest, local_commits = ingest(local, None, trajs)
        runs = [run_server(ms, trajs, local, tmp, args.samples) for ms in args.latency_ms]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "machine": {
            **machine_info(),  # commit, time and CPU, for benchmarks/report.py
            "cpus": os.cpu_count(),
            "loadavg_before": load0,
            "loadavg_after": os.getloadavg(),
        },
        "local_ingest_s": local_ingest,
        "local_ingest_commits": local_commits,
        "servers": runs,
    }
    print(
        f"load average before {load0[0]:.2f}, after {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)"
    )
    print(
        "| server | S3 sample(256) ms (p90) | fetch-all ms: obstore / s3fs cat | local ms | "
        "S3 / fetch-all | S3 / local | requests per sample | MB per sample | cold ms (requests) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        s3, fa, cat, lo = (
            r["s3_sample"]["median_ms"],
            r["fetch_all_obstore"]["median_ms"],
            r["fetch_all_s3fs_cat"]["median_ms"],
            r["local_sample"]["median_ms"],
        )
        rq = r["requests_per_sample"]
        name = "moto" if not r["latency_ms"] else f"moto + {r['latency_ms']:g} ms"
        print(
            f"| {name} | {s3:.0f} ({r['s3_sample']['p90_ms']:.0f}) | {fa:.0f} / {cat:.0f} | "
            f"{lo:.1f} | {s3 / fa:.2f}x | {s3 / lo:.1f}x | {rq.get('requests', 0):g} "
            f"({rq.get('GET-range', 0):g} ranged, {rq.get('GET', 0):g} whole) | "
            f"{rq.get('bytes_out', 0) / 1e6:.1f} | {r['s3_cold_sample_ms']:.0f} "
            f"({r['s3_cold_sample_requests']}) |"
        )
    print()
    print(
        "| server | steady: S3 sample(256) ms (p90) | local ms | S3 / local | S3 / fetch-all | requests per sample |"
    )
    print("|---|---|---|---|---|---|")
    for r in runs:
        name = "moto" if not r["latency_ms"] else f"moto + {r['latency_ms']:g} ms"
        st, lo, fa = (
            r["s3_sample_steady"],
            r["local_sample_steady"]["median_ms"],
            r["fetch_all_obstore"]["median_ms"],
        )
        print(
            f"| {name} | {st['median_ms']:.1f} ({st['p90_ms']:.1f}) | {lo:.1f} | "
            f"{st['median_ms'] / lo:.1f}x | {st['median_ms'] / fa:.2f}x | "
            f"{r['requests_per_sample_steady'].get('requests', 0):g} |"
        )
    print()
    print(
        "| server | ingest S3 s (commits) | ingest local s (commits) | S3 / local | requests (by kind) | open S3 ms (requests) |"
    )
    print("|---|---|---|---|---|---|")
    for r in runs:
        name = "moto" if not r["latency_ms"] else f"moto + {r['latency_ms']:g} ms"
        kinds = {k: v for k, v in r["s3_ingest_requests"].items() if not k.startswith("bytes")}
        print(
            f"| {name} | {r['s3_ingest_s']:.2f} ({r['s3_ingest_commits']}) | "
            f"{local_ingest:.2f} ({local_commits}) | {r['s3_ingest_s'] / local_ingest:.1f}x | "
            f"{kinds} | {r['s3_open_ms']:.0f} ({r['s3_open_requests'].get('requests')}) |"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
