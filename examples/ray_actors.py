"""RLinf-shaped distributed collection on Ray with one shared zreplay buffer, no server.

Rollout actors (Ray actors, as RLinf's env/rollout workers are) each produce ``[T, B,
...]`` trajectories (``curr_obs``/``next_obs`` images and states, action chunks, rewards,
done flags, per-step policy ``versions``) and append them to their own segment of one
buffer (``writer_id=f"rollout{i}"``).  The learner, in the driver, opens the buffer
read-only, samples batches of the union and calls ``refresh()`` to see what the actors
committed since; every ``--update-every`` steps it bumps the policy version and sends it
to the actors (as a weight sync would), so their next trajectories carry it.

    python examples/ray_actors.py --path runs/ray_buf --actors 2 --rollouts 10
    python examples/ray_actors.py --path runs/ray_buf --overwrite --samples-per-insert 1 --max-staleness 2
    python examples/ray_actors.py --moto   # the same against an S3 endpoint (moto, in-process)

Options worth knowing:

* ``--samples-per-insert X --error-buffer E``: rate limiting (``zreplay.SampleToInsertRatio``):
  the learner declares itself (``learner_id="learner"``) and waits when it has sampled more
  than ``X`` per inserted row (+/- ``E``); the actors wait when they run ahead of it.
* ``--max-staleness K``: the learner samples with ``zreplay.samplers.Staleness(K)`` and
  passes its current version to ``sample(..., version=v)``: rows more than ``K`` versions
  old are never drawn (the report counts the stale rows drawn: 0).

Prints one table (actor ingest, learner sampling, waits) and, with ``--json``, one JSON
line ``RESULT {...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

import numpy as np
import ray
import torch

import zreplay
from zreplay.errors import RateLimitTimeout
from zreplay.samplers import Staleness, Uniform


def rollout_trajectory(rng, T: int, B: int, img: int, version: int) -> zreplay.Trajectory:
    """One rollout epoch of B envs for T chunk steps, shaped like RLinf's Trajectory."""
    C, A, D = 4, 7, 8

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a))

    base = rng.integers(0, 255, size=(1, B, 1, 1, 3), dtype=np.uint8)
    ramp = np.arange(img, dtype=np.uint8)[None, None, :, None, None]  # compressible frames
    frames = (base + ramp + np.arange(T + 1, dtype=np.uint8)[:, None, None, None, None]).astype(
        np.uint8
    )
    frames = np.broadcast_to(frames, (T + 1, B, img, img, 3))
    states = rng.standard_normal((T + 1, B, D)).astype(np.float32)
    dones = rng.random((T, B, C)) < 0.01
    return zreplay.Trajectory(
        max_episode_length=200,
        model_weights_id=str(version),
        actions=t(rng.standard_normal((T, B, C * A)).astype(np.float32)),
        intervene_flags=t(np.zeros((T, B, C * A), bool)),
        rewards=t(rng.standard_normal((T, B, C)).astype(np.float32)),
        terminations=t(dones),
        truncations=t(np.zeros((T, B, C), bool)),
        dones=t(dones),
        prev_logprobs=t(rng.standard_normal((T, B, C * A)).astype(np.float32)),
        versions=t(np.full((T, B, 1), float(version), np.float32)),
        curr_obs={"main_images": t(frames[:-1]), "states": t(states[:-1])},
        next_obs={"main_images": t(frames[1:]), "states": t(states[1:])},
    )


@ray.remote(num_cpus=0, max_concurrency=2)  # one thread rolls out, one takes version updates
class RolloutActor:
    def __init__(self, path, options, writer_id, shape, limiter, seed):
        self.shape, self.version = shape, 0
        self.rng = np.random.default_rng(seed)
        self.buf = zreplay.TrajectoryReplayBuffer(
            auto_save=True,
            auto_save_path=path,
            storage_options=options,
            writer_id=writer_id,
            rate_limiter=limiter,
        )

    def set_version(self, version: int) -> None:
        self.version = version

    def run(self, rollouts: int) -> dict:
        """Produce and add ``rollouts`` trajectories; returns ingest figures."""
        T, B, img = self.shape
        made = add = 0.0
        rows = 0
        t0 = time.perf_counter()
        for _ in range(rollouts):
            a = time.perf_counter()
            traj = rollout_trajectory(self.rng, T, B, img, self.version)
            b = time.perf_counter()
            self.buf.add_trajectories([traj])  # waits here when rate-limited
            made, add = made + b - a, add + time.perf_counter() - b
            rows += T * B
        self.buf.flush()
        total = time.perf_counter() - t0
        self.buf.close()
        return {"rows": rows, "seconds": total, "make_s": made, "add_s": add}


def start_moto() -> tuple[str, dict, object]:
    import logging

    import moto.server
    import s3fs

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto.server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    opts = {"endpoint_url": f"http://{host}:{port}", "key": "testing", "secret": "testing"}
    s3fs.S3FileSystem(**opts).mkdir("zreplay-example")
    return "s3://zreplay-example/ray_buf", opts, server


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--path", default="runs/ray_buf", help="buffer directory or s3:// URL")
    p.add_argument("--overwrite", action="store_true", help="delete --path first")
    p.add_argument("--moto", action="store_true", help="use an in-process moto S3 server")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--rollouts", type=int, default=10, help="trajectories per actor")
    p.add_argument("--T", type=int, default=50, help="chunk steps per trajectory")
    p.add_argument("--B", type=int, default=8, help="parallel envs per actor")
    p.add_argument("--img", type=int, default=64, help="image side (pixels)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--update-every", type=int, default=20, help="learner steps per version")
    p.add_argument("--samples-per-insert", type=float, default=None)
    p.add_argument("--error-buffer", type=float, default=None)
    p.add_argument("--max-staleness", type=int, default=None)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)

    server = None
    path, options = a.path, None
    if a.moto:
        path, options, server = start_moto()
    elif a.overwrite and os.path.exists(path):
        shutil.rmtree(path)

    limiter = learner_limiter = None
    if a.samples_per_insert is not None:
        rows = a.T * a.B
        eb = a.error_buffer if a.error_buffer is not None else 4 * rows * a.samples_per_insert
        ratio = (a.samples_per_insert, rows, eb)
        limiter = zreplay.SampleToInsertRatio(*ratio, timeout_s=120)
        # the learner gives up a wait after 1 s to see whether the actors are done
        learner_limiter = zreplay.SampleToInsertRatio(*ratio, timeout_s=1.0)

    own_ray = not ray.is_initialized()  # a caller's cluster (the tests') is used as it is
    if own_ray:
        ray.init(num_cpus=max(2, a.actors), include_dashboard=False, log_to_driver=False)
    # The buffer root exists before the learner opens it (the first actor would create it).
    zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, storage_options=options, writer_id="rollout0"
    ).close()
    sampler = Staleness(a.max_staleness) if a.max_staleness is not None else Uniform()
    learner = zreplay.open(
        path,
        seed=0,
        sampler=sampler,
        storage_options=options,
        rate_limiter=learner_limiter,
        learner_id="learner" if limiter is not None else None,
    )
    actors = [
        RolloutActor.remote(path, options, f"rollout{i}", (a.T, a.B, a.img), limiter, seed=i)
        for i in range(a.actors)
    ]
    t0 = time.perf_counter()
    futures = [act.run.remote(a.rollouts) for act in actors]
    pending = list(futures)
    version, steps, rows, stale, sample_s = 0, 0, 0, 0, 0.0
    while pending:
        _, pending = ray.wait(pending, timeout=0)
        learner.refresh()
        if learner.num_rows == 0:
            time.sleep(0.05)
            continue
        s0 = time.perf_counter()
        if steps == 0:
            first = s0
        try:
            batch = learner.sample(a.batch, version=version)
        except RateLimitTimeout:
            continue
        except zreplay.EmptyBufferError:  # every row stale until fresh ones arrive
            time.sleep(0.05)
            continue
        dt = time.perf_counter() - s0
        sample_s += dt
        steps, rows = steps + 1, rows + a.batch
        if a.max_staleness is not None:
            stale += int((version - batch["versions"][:, 0] > a.max_staleness).sum())
        if steps % a.update_every == 0:
            version += 1
            for act in actors:
                act.set_version.remote(version)
    wall = time.perf_counter() - t0
    active = time.perf_counter() - first if steps else 0.0
    learner.close()
    stats = ray.get(futures)
    view = zreplay.open(path, storage_options=options)
    total_rows = view.num_rows
    row_bytes = view.schema.row_bytes
    for act in actors:
        ray.kill(act)
    if own_ray:
        ray.shutdown()
    if server is not None:
        server.stop()
    out = {
        "actors": a.actors,
        "trajectory": [a.T, a.B],
        "rows": total_rows,
        "row_bytes": row_bytes,
        "wall_s": round(wall, 2),  # includes starting the actors (imports)
        # actor side: from its first add to its last commit (waits included)
        "ingest_rows_per_s": round(total_rows / max(s["seconds"] for s in stats)),
        "ingest_mb_per_s": round(
            total_rows * row_bytes / max(s["seconds"] for s in stats) / 1e6, 1
        ),
        "actor_rows_per_s": [round(s["rows"] / s["seconds"]) for s in stats],
        "learner_batches": steps,
        "learner_rows_per_s": round(rows / active) if active else 0,
        "learner_sample_ms": round(1e3 * sample_s / max(steps, 1), 2),
        "final_version": version,
        "stale_rows_drawn": stale if a.max_staleness is not None else None,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "actor_add_s": [round(s["add_s"], 2) for s in stats],
        "actor_make_s": [round(s["make_s"], 2) for s in stats],
    }
    print(f"{'actors':<22}{a.actors} x {a.rollouts} trajectories [T={a.T}, B={a.B}]")
    for k in ("rows", "wall_s", "ingest_rows_per_s", "ingest_mb_per_s", "learner_batches"):
        print(f"{k:<22}{out[k]}")
    keys = ("learner_rows_per_s", "learner_sample_ms", "final_version", "stale_rows_drawn")
    for k in (*keys, "actor_rows_per_s", "actor_add_s", "actor_make_s", "load_avg_1m"):
        print(f"{k:<22}{out[k]}")
    if a.json:
        print("RESULT " + json.dumps(out))
    return out


if __name__ == "__main__":
    main()
