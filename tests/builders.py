"""The neutral builder: engine and core specs made through ``zreplay.core``, not a facade.

A test of eviction, the RAM tier, the index, the episode table or commit visibility builds
its buffer here, so it says nothing in one ecosystem's words and follows the core's API
in this one place when that API changes.

Every value of a trajectory built here encodes where it came from, as in conftest.py:
``code = tid * 10000 + lane * 100 + step`` in every element of every float key.
"""

from __future__ import annotations

import numpy as np

from zreplay.core import BufferCore, Prepared, RamPolicy, RandomStream
from zreplay.schema import flatten, unflatten

KEYS = {"obs": (2,), "reward": ()}  # key -> row shape; float32


def writer(
    path=None, *, sampler=None, capacity=None, ram_trajectories=5, ram_bytes=None, seed=0, **options
):
    """A writable core on segment ``writer_id`` (default ``"default"``) of the buffer at
    ``path`` (``None``: a temporary store); ``ram_trajectories``: how many of the newest
    trajectories the RAM tier keeps (``0``: committed rows are read from disk; ``None``:
    as many as ``ram_bytes`` of committed rows hold); ``options``: the other store
    options (``writer_id``, ``durable``, ``staging_bytes``, ...)."""
    ram = RamPolicy(
        enabled=ram_trajectories != 0, trajectories=ram_trajectories or None, max_bytes=ram_bytes
    )
    return BufferCore.writer(
        path, sampler=sampler, stream=RandomStream(seed), capacity=capacity, ram=ram, **options
    )


def reader(path, *, sampler=None, seed=0, **options):
    """A read-only core over every segment of the buffer at ``path``."""
    return BufferCore.reader(path, sampler=sampler, seed=seed, **options)


def trajectory(tid: int, T: int = 6, B: int = 3, keys=KEYS, ends=None, continues=False):
    """A ``[T, B]`` trajectory: float32 ``keys`` (key -> row shape) holding its codes;
    ``ends`` (``[T, B]`` bools, optional): steps where an episode terminates."""
    code = (tid * 10000 + np.arange(B)[None, :] * 100 + np.arange(T)[:, None]).astype(np.float32)
    columns = {
        k: np.broadcast_to(code.reshape(T, B, *(1,) * len(s)), (T, B, *s)).copy()
        for k, s in keys.items()
    }
    if ends is not None:
        columns["terminations"] = np.asarray(ends, bool)
    return Prepared(columns, T, B, continues=continues)


def full(tid: int, T: int = 6, B: int = 3) -> Prepared:
    """``conftest.make_traj(tid, T, B)``'s columns (every key, dtype and value: flags,
    ``versions``, ``curr_obs/main_images`` ...), flat, as a trajectory of the core: for
    specs of what many keys of many dtypes do (column caches, the plain-zarr layout);
    ``conftest.check_rows(nested(core.sample(n)))`` checks a sample of them."""
    from conftest import make_traj

    d = make_traj(tid, T, B, as_dict=True)
    max_len, weights_id = d.pop("max_episode_length"), d.pop("model_weights_id")
    columns = {k: np.asarray(v) for k, v in flatten(d).items()}
    return Prepared(columns, T, B, max_len, weights_id)


def add_full(core, tids) -> list[int]:
    """Add :func:`full` trajectory ``tid`` for each of ``tids``; their trajectory ids."""
    return core.add([full(t) for t in tids])


def nested(batch: dict) -> dict:
    """A core's flat batch (``"curr_obs/states"``) nested as the facades give it."""
    return unflatten(batch)


def add(core, tid: int, T: int = 6, B: int = 3, **kw) -> int:
    """Add :func:`trajectory` ``tid`` to ``core``; its trajectory id."""
    (got,) = core.add([trajectory(tid, T, B, **kw)])
    return got


def tids(rows) -> np.ndarray:
    """The trajectory each sampled row of a float key came from (``[N, ...]`` -> ``[N]``)."""
    rows = np.asarray(rows)
    return (rows.reshape(len(rows), -1)[:, 0] // 10000).astype(np.int64)
