"""Shared helpers: trajectories whose every value encodes (trajectory, env, step).

``code = tid * 10000 + b * 100 + t`` is written into every float channel, ``code % 251``
into every image pixel and ``code % 3 == 0`` into every flag, so a sampled row whose
fields come from different transitions is detectable (see :func:`check_rows`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

import zreplay

# Column cache files (zreplay.engine.colcache) of the buffers tests make go to a directory
# of this run, not the user's ~/.cache; subprocesses inherit it.
if "ZREPLAY_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["ZREPLAY_CACHE_DIR"] = tempfile.mkdtemp(prefix="zreplay-test-cols-")
    atexit.register(shutil.rmtree, os.environ["ZREPLAY_CACHE_DIR"], True)

# Tests the README's quick command leaves to the slow set, besides those marked in their
# files (tests/slow_tests.txt says why these).
SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")


def slow_test_ids() -> set[str]:
    """The node ids tests/slow_tests.txt lists (comments and blank lines aside)."""
    lines = SLOW_TESTS.read_text().splitlines()
    return {line for line in lines if line.strip() and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    listed = slow_test_ids()
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)


C, A, IMG = 2, 3, 8


SRC = str(Path(zreplay.__file__).resolve().parents[1])


def zreplay_cli(*args: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m zreplay.cli`` on this checkout's code, as a shell would."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "zreplay.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


def make_traj(tid: int, T: int = 6, B: int = 3, epochs: int = 0, as_dict: bool = False):
    t = np.arange(T)[:, None]
    b = np.arange(B)[None, :]
    code = (tid * 10000 + b * 100 + t).astype(np.float32)  # [T, B]

    def fl(*row):
        return torch.from_numpy(
            np.broadcast_to(code[..., None], (T, B, *row)).copy().reshape(T, B, *row)
        )

    def flag():
        body = np.broadcast_to((code % 3 == 0)[..., None], (T, B, C))
        if not epochs:
            return torch.from_numpy(body.copy())
        # RLinf layout: one all-False bootstrap row at the start of each epoch.
        per = T // epochs
        f = np.zeros((epochs, per + 1, B, C), bool)
        f[:, 1:] = body.reshape(epochs, per, B, C)
        return torch.from_numpy(f.reshape(T + epochs, B, C))

    img = torch.from_numpy(
        np.broadcast_to(
            (code % 251).astype(np.uint8)[..., None, None, None], (T, B, IMG, IMG, 3)
        ).copy()
    )
    traj = zreplay.Trajectory(
        max_episode_length=100 + tid,
        actions=fl(C * A),
        intervene_flags=torch.zeros(T, B, C * A, dtype=torch.bool),
        rewards=fl(C),
        terminations=flag(),
        truncations=flag(),
        dones=flag(),
        prev_logprobs=fl(C * A),
        versions=torch.full((T, B, 1), float(tid)),
        curr_obs={"main_images": img, "states": fl(4)},
        next_obs={"main_images": img.clone(), "states": fl(4) + 1},
    )
    if as_dict:
        return {k: v for k, v in vars(traj).items() if v is not None}
    return traj


def codes_of(sample) -> np.ndarray:
    a = sample["actions"]
    a = a.numpy() if hasattr(a, "numpy") else a
    return a[:, 0].astype(np.int64)


def check_rows(sample) -> np.ndarray:
    """Assert every field of every row belongs to the same transition; return codes."""

    def np_(x):
        return x.numpy() if hasattr(x, "numpy") else np.asarray(x)

    code = codes_of(sample)
    cf = code.astype(np.float32)
    for key in ("actions", "rewards", "prev_logprobs"):
        assert (np_(sample[key]) == cf[:, None]).all(), key
    assert (np_(sample["curr_obs"]["states"]) == cf[:, None]).all()
    assert (np_(sample["next_obs"]["states"]) == cf[:, None] + 1).all()
    img = np_(sample["curr_obs"]["main_images"])
    assert (img == (code % 251).astype(np.uint8)[:, None, None, None]).all()
    for key in ("dones", "terminations", "truncations"):
        assert (np_(sample[key]) == (code % 3 == 0)[:, None]).all(), key
    assert (np_(sample["versions"])[:, 0] == code // 10000).all()
    return code


def traj_equal(got: dict, want) -> None:
    """Compare a read-back trajectory (nested numpy) with the one that was added."""
    want = (
        want if isinstance(want, dict) else {k: v for k, v in vars(want).items() if v is not None}
    )
    T = np.asarray(want["actions"]).shape[0]
    for k, v in want.items():
        if k in ("max_episode_length", "model_weights_id"):
            continue
        if isinstance(v, dict):
            for kk, vv in v.items():
                np.testing.assert_array_equal(got[k][kk], np.asarray(vv), err_msg=f"{k}/{kk}")
            continue
        v = np.asarray(v)
        if v.shape[0] != T:  # epoch bootstrap rows are dropped
            e = v.shape[0] - T
            v = v.reshape(e, T // e + 1, *v.shape[1:])[:, 1:].reshape(T, *v.shape[1:])
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def shard_files(root, key: str, segment: str = "default") -> list:
    """The shard files of data key ``key`` of a local buffer, in shard order (format 5:
    ``c.<shard>.0...`` files in the array's directory; format 4: ``c/<shard>/0/...``)."""
    array = Path(root) / "segments" / segment / "data" / key
    found = []
    for r, _, names in os.walk(array):
        for name in names:
            rel = os.path.relpath(os.path.join(r, name), array)
            parts = rel.replace("/", ".").split(".")
            if parts[0] == "c" and all(p.isdigit() for p in parts[1:]):
                found.append((int(parts[1]), Path(r) / name))
    return [p for _, p in sorted(found)]


def tree_state(root, skip=None) -> dict:
    """Every file and directory under ``root`` (but not under ``skip``) with its size and
    modification time: equal before and after means nothing there was touched."""
    out = {}
    for r, dirs, files in os.walk(root):
        if skip is not None:
            dirs[:] = [d for d in dirs if os.path.join(r, d) != str(skip)]
        for name in dirs + files:
            st = os.lstat(os.path.join(r, name))
            out[os.path.relpath(os.path.join(r, name), root)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def bufpath(tmp_path):
    return str(tmp_path / "buf.zarr")


@pytest.fixture
def open_buffers():
    """Buffers created in a test, closed at its end even when it fails."""
    made = []
    yield made
    for b in made:
        try:
            b.close()
        except Exception:
            pass


# -- real child processes ---------------------------------------------------------------
# A fresh interpreter spends ~1.6 s importing torch and TensorStore.  A forkserver that
# has imported them once starts each child in ~10 ms.  zreplay itself must not be
# preloaded: it marks processes forked after it was imported (TensorStore does not survive
# a fork once used) and refuses to write from them.  Imported after the fork, in the
# child, it is an ordinary process that may write.
PRELOAD = ["numpy", "torch", "torch.distributed", "tensorstore", "zarr", "numcodecs", "pytest"]


def processes():
    """The multiprocessing context child processes of the tests are started with."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # ignored once the server runs; it then has them
    return ctx


def _child_main(conn, fn, args):
    try:
        out = fn(*args)
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None
    conn.send(("ok", out))


def run_children(jobs, timeout: float = 60.0) -> list:
    """Run each ``(fn, args)`` of ``jobs`` as ``fn(*args)`` in its own process, all at once;
    return their results in order, or fail with a child's traceback."""
    ctx = processes()
    running = []
    for fn, args in jobs:
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child_main, args=(send, fn, tuple(args)))
        p.start()
        send.close()
        running.append((p, recv, fn.__name__))
    deadline = time.monotonic() + timeout
    results = []
    try:
        for p, recv, name in running:
            if not recv.poll(max(0.0, deadline - time.monotonic())):
                raise AssertionError(f"child {p.pid} ({name}) timed out after {timeout} s")
            try:
                status, out = recv.recv()
            except EOFError:
                p.join(5)
                raise AssertionError(
                    f"child {p.pid} ({name}) died with exit code {p.exitcode}"
                ) from None
            if status == "error":
                raise AssertionError(f"child {p.pid} ({name}) failed:\n{out}")
            results.append(out)
    finally:
        for p, _, _ in running:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    return results


S3_BUCKET = "zreplay-tests"


@pytest.fixture(scope="session")
def s3():
    """A moto S3 server on a free port of 127.0.0.1 and a bucket, shared by the test
    session (moto keeps its buckets in the process); stopped at the end."""
    import logging

    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {"endpoint_url": f"http://{host}:{port}", "key": "testing", "secret": "testing"}
    fs = s3fs.S3FileSystem(**options)
    if not fs.exists(S3_BUCKET):
        fs.mkdir(S3_BUCKET)
    yield options
    server.stop()


@pytest.fixture
def url(s3):
    """A fresh buffer URL in the moto bucket."""
    return f"s3://{S3_BUCKET}/{uuid.uuid4().hex[:8]}/buf"


@pytest.fixture(params=["local", "s3"])
def shared_location(request, tmp_path):
    """``(path or URL, storage_options)`` of a new buffer on local disk or on moto's S3."""
    if request.param == "local":
        return str(tmp_path / "buf.zarr"), None
    options = request.getfixturevalue("s3")
    return f"s3://{S3_BUCKET}/{uuid.uuid4().hex[:8]}/buf", options


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """12 trajectories [6, 3] (every value encodes trajectory, lane, step) on disk."""
    path = tmp_path_factory.mktemp("read") / "buf"
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path)) as buf:
        buf.add_trajectories([make_traj(i) for i in range(12)])
    return path


@pytest.fixture
def written(bufpath):
    """``(path, trajectories)``: 4 trajectories [3 + i, 2] written by a writer now closed."""
    trajs = [make_traj(i, T=3 + i, B=2) for i in range(4)]
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath) as buf:
        buf.add_trajectories(trajs)
    return bufpath, trajs
