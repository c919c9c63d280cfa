"""Every operation that changes a buffer is all or nothing under an I/O error or a crash
at any store-layer I/O call (issue 13).

For each scenario (add + flush, eviction with reclaim, clear, save_checkpoint over an
existing one, load_checkpoint of a zreplay buffer and of an RLinf directory, priority
save, on a local disk and on S3 through moto's server; an RLinf export and an HDF5 dump
replacing earlier ones, and an HDF5 append (error mode only: it is in place), on a local
disk) the harness counts the operation's
store-layer I/O calls (:mod:`faultlib`), then for each call index i (every one, or a
seeded sample when there are more than the budget):

* ``error``: call i raises ``OSError``.  The operation raises a clear error (an OSError
  or a zreplay error), the buffer in memory holds the before- or the after-state, and so
  does the buffer reopened, with ``verify`` clean;
* ``crash``: a child process doing the operation dies at call i (``os._exit``).  The
  buffer reopened holds the before- or the after-state, with ``verify`` clean.

An export or a dump is observed as its files read back (the RLinf directory holding no
file its index does not name), which must be the earlier one or the new one whole.

Either way trajectory ids are never reused: the next one added is above every id either
state holds.  ``ZREPLAY_FAULT_POINTS`` sets the points per scenario and mode (``all`` for
every call); the CI default is a smaller seeded sample (benchmarks/HISTORY.md reports the
full sweep).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import threading
import time
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import S3_BUCKET, check_rows, make_traj, processes
from faultlib import CRASH_STATUS, Faults, budget, injection_points

import zreplay
from zreplay.compat.hdf5 import iter_hdf5
from zreplay.compat.rlinf_files import trajectory_file
from zreplay.errors import ZReplayError
from zreplay.samplers import Prioritized
from zreplay.store.location import locate

pytestmark = pytest.mark.slow  # a sweep: run by `python -m pytest -m slow` (.ci/run)

SMALL = {"chunk_rows": 4, "shard_rows": 8}  # many shards: eviction reclaims files


# -- what a buffer holds --------------------------------------------------------------


@dataclass(frozen=True)
class State:
    ids: tuple[int, ...]
    digests: tuple[str, ...]
    priorities: tuple[float, ...] | None = None


def _digest(tree) -> str:
    h = hashlib.sha1()

    def walk(node, prefix=""):
        for k in sorted(node):
            v = node[k]
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}/")
            elif k != "trajectory_id":
                h.update(f"{prefix}{k}".encode())
                h.update(
                    np.ascontiguousarray(v).tobytes()
                    if isinstance(v, np.ndarray)
                    else repr(v).encode()
                )

    walk(tree)
    return h.hexdigest()[:16]


def writer(path, so, prioritized=False, **kw):
    kw.setdefault("sample_window_size", 0)
    if prioritized:
        kw["sampler"] = Prioritized(alpha=1.0, eps=0.0)
    return zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, storage_options=so, **kw
    )


def held(buf, prioritized=False) -> State:
    ids, digests = [], []
    for i in range(len(buf)):
        t = buf.trajectory(i)
        ids.append(int(t["trajectory_id"]))
        digests.append(_digest(t))
    prios = None
    if prioritized and len(buf):
        index = buf.core.engine.state.index
        prios = tuple(np.round(buf.priorities(np.arange(index.low_row, index.n_rows)), 6))
    return State(tuple(ids), tuple(digests), prios)


def observe(path, so, prioritized=False, used_ids=None) -> State:
    """Reopen the buffer at ``path`` (finishing what a crash left: what a user's next open
    does) and read what it holds; every sampled row is whole, and verify is clean.  With
    ``used_ids`` (a function of the state read), a trajectory added next must get an id
    above all of them: ids are never reused."""
    with writer(path, so, prioritized) as buf:
        state = held(buf, prioritized)
        if len(buf):
            check_rows(buf.sample(64))
        if used_ids is not None:
            (new,) = buf.add_trajectories([make_traj(99)])
            top = max(used_ids(state), default=-1)
            assert new > top, f"trajectory id {new} reused (ids used up to {top})"
    report = zreplay.verify(path, storage_options=so)
    assert report.ok, str(report)
    return state


# -- scenarios ------------------------------------------------------------------------
# setup(paths, so) builds the before-state; act(paths, so) is the operation (run under
# injected faults); "observed" names the path whose state must be before or after.


def _setup_buffer(paths, so, tids=(0, 1), **kw):
    with writer(paths["buf"], so, **kw) as buf:
        buf.add_trajectories([make_traj(t) for t in tids])


def _in_memory(buf, before: State | None, after: State | None, prioritized=False):
    if before is not None:
        now = held(buf, prioritized)
        assert now in (before, after), f"in memory: {now}"


def _act_on_buffer(
    paths, so, action, prioritized=False, before=None, after=None, observed_prio=None, **kw
):
    buf = writer(paths["buf"], so, prioritized, **kw)
    try:
        action(buf, paths)
    except BaseException:
        _in_memory(buf, before, after, prioritized if observed_prio is None else observed_prio)
        raise
    finally:
        buf.close()


HANDED_OUT: list[int] = []  # ids add_trajectories returned in this process


def _add(buf, paths):
    HANDED_OUT.extend(buf.add_trajectories([make_traj(2), make_traj(3)]))
    buf.flush()


def _clear(buf, paths):
    buf.clear()


def _save(buf, paths):
    buf.save_checkpoint(paths["ckpt"])


def _load(buf, paths):
    buf.load_checkpoint(paths["src"])


def _reprioritize(buf, paths):
    index = buf.core.engine.state.index
    rows = np.arange(index.low_row, index.n_rows)
    buf.update_priorities(rows, 1.0 + (rows % 7))
    buf.flush()


def _setup_ckpt(paths, so):
    with writer(paths["buf"], so) as buf:
        buf.add_trajectories([make_traj(0)])
        buf.save_checkpoint(paths["ckpt"])
        buf.add_trajectories([make_traj(1), make_traj(2)])


def _setup_load_zreplay(paths, so):
    _setup_buffer(paths, so)
    with writer(paths["src"], so) as src:
        src.add_trajectories([make_traj(t) for t in (10, 11, 12)])


def _setup_load_rlinf(paths, so):
    _setup_buffer(paths, so)
    with writer(paths["tmp"], so) as src:
        src.add_trajectories([make_traj(t) for t in (10, 11, 12)])
        src.export(paths["src"])


def _setup_export(paths, so):
    with writer(paths["buf"], so) as buf:
        buf.add_trajectories([make_traj(0)])
        buf.export(paths["ckpt"])  # an earlier export, which the action replaces
        buf.dump(paths["src"])  # an earlier HDF5 dump, likewise
        buf.add_trajectories([make_traj(1), make_traj(2)])


def _export(buf, paths):
    buf.export(paths["ckpt"])


def _dump(buf, paths):
    buf.dump(paths["src"])


def _append(buf, paths):
    buf.dump(paths["src"], mode="append")


def observe_rlinf(path) -> State:
    """What the RLinf directory at ``path`` holds, read back through RLinf's own file
    layout; no file there that its index does not name."""
    with zreplay.TrajectoryReplayBuffer() as buf:
        buf.load_checkpoint(path)
        state = held(buf)
    index = json.loads((Path(path) / "trajectory_index.json").read_text())
    named = {
        trajectory_file(Path(path), int(t), v["model_weights_id"], "pt").name
        for t, v in index["trajectory_index"].items()
    }
    assert set(os.listdir(path)) == named | {"trajectory_index.json", "metadata.json"}
    return state


def observe_hdf5(path) -> State:
    """The episodes of the HDF5 file at ``path``, one digest each, and its datasets'."""
    episodes = list(iter_hdf5(path))
    with h5py.File(path, "r") as f:
        shapes = repr(sorted((k, f[k].shape) for k in f))
    return State((len(episodes), zlib.crc32(shapes.encode())), tuple(_digest(e) for e in episodes))


def _setup_priorities(paths, so):
    with writer(paths["buf"], so, prioritized=True) as buf:
        buf.add_trajectories([make_traj(0), make_traj(1)])
        buf.update_priorities(np.arange(36), 2.0)


# -- issue 20: damaged priority copies, lock takeovers, learner progress, TorchRL ----------


def _damage_copy(paths, so, which: str) -> None:
    """Cut every file of the priority copy the commit names (``which="named"``) or of the
    other one to 0 bytes, as a power cut can leave them."""
    seg = locate(paths["buf"], so) / "segments" / "default"
    commit = json.loads((seg / "zreplay" / "commit.json").read_bytes())
    named = int(commit["sampler"]["priority"]["slot"])
    copy = seg / "priority" / str(named if which == "named" else 1 - named)
    files = [loc for _, loc in copy.backend.walk_files(copy)]
    assert files, f"priority copy {copy} holds no file"
    for loc in files:
        loc.backend.publish(loc, b"", durable=False)


def _setup_damaged_priorities(which: str):
    def setup(paths, so):
        with writer(paths["buf"], so, prioritized=True) as buf:
            buf.add_trajectories([make_traj(0), make_traj(1)])
            buf.update_priorities(np.arange(36), 2.0)
            buf.flush()  # a first save
            buf.update_priorities(np.arange(36), 3.0)  # a second: both copies written
        _damage_copy(paths, so, which)

    return setup


def _add_prioritized(buf, paths):
    HANDED_OUT.extend(buf.add_trajectories([make_traj(2), make_traj(3)]))
    buf.flush()


def _stale_lock(foreign_namespace: bool, whole: bool = False):
    """A buffer whose writer died holding its lock: a dead pid of this namespace, or (a
    container's) a pid of another PID namespace whose flock is free.  ``whole``: the lock
    is the buffer's own (``zreplay/writer.lock`` at its root), which a replacement (an
    import, a checkpoint save) left when it died; the next writer removes it."""

    def setup(paths, so):
        _setup_buffer(paths, so)
        from zreplay.store.liveness import BOOT_ID, PID_NS

        info = {"host": socket.gethostname(), "pid": 2**22 + 3, "token": "dead", "time": 0}
        info.update(boot=BOOT_ID, pidns="pid:[1]" if foreign_namespace else PID_NS, lease_s=30)
        where = locate(paths["buf"], so)
        if not whole:
            where = where / "segments" / "default"
        lock = where / "zreplay" / "writer.lock"
        lock.backend.publish(lock, json.dumps(info).encode(), durable=False)

    return setup


def _contend_then_add(buf, paths):
    """A second writer of the segment fails while the first holds it; the first adds."""
    try:
        writer(paths["buf"], buf.path.backend.storage_options or None).close()
        raise AssertionError("a second writer opened a held segment")
    except zreplay.WriterLockedError:
        pass
    _add(buf, paths)


LEARNER = dict(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=10**6)


def _setup_learner(paths, so):
    _setup_buffer(paths, so)
    lim = zreplay.SampleToInsertRatio(**LEARNER, publish_every_s=0)
    view = zreplay.open(paths["buf"], storage_options=so, rate_limiter=lim, learner_id="L")
    view.sample(5)
    view.close()


def _learn(paths, so):
    lim = zreplay.SampleToInsertRatio(**LEARNER, publish_every_s=0)
    # Closed here even when a fault raised: a view left to be dropped closes (and
    # publishes) on a thread of its own, whose requests the next point's count would take.
    with zreplay.open(paths["buf"], storage_options=so, rate_limiter=lim, learner_id="L") as view:
        view.sample(7)


def observe_progress(paths, so) -> State:
    """The learner's published count (its file parses, whole) and the buffer untouched."""
    from zreplay.store.progress import read_progress

    got = read_progress(locate(paths["buf"], so), "L")
    data = observe(paths["buf"], so)
    return State((got.samples,), data.digests)


TORCHRL_SLOTS = 10


def _storage(path, so=None):
    from zreplay.torchrl import ZarrStorage

    return ZarrStorage(TORCHRL_SLOTS, path, storage_options=so)


def _rows(start: int, n: int):
    import torch
    from tensordict import TensorDict

    g = torch.arange(start, start + n)
    return TensorDict({"g": g, "obs": g.float().unsqueeze(-1).expand(n, 3).clone()}, [n])


def _extend(storage, start: int, n: int) -> None:
    """Extend through TorchRL's own buffer and round-robin writer."""
    from torchrl.data import TensorDictReplayBuffer

    TensorDictReplayBuffer(storage=storage, batch_size=1).extend(_rows(start, n))


def _setup_torchrl_dump(paths, so):
    s = _storage(paths["buf"], so)
    _extend(s, 0, 6)
    s.dumps(paths["ckpt"])  # an earlier dump, which the action replaces
    _extend(s, 100, 7)  # wraps the ring of 10
    s.close()


def _torchrl_dump(paths, so):
    s = _storage(paths["buf"], so)
    try:
        s.dumps(paths["ckpt"])
    finally:
        s.close()


def _setup_torchrl_load(paths, so):
    s = _storage(paths["buf"], so)
    _extend(s, 0, 4)
    s.close()
    src = _storage(paths["src"], so)
    _extend(src, 200, 13)  # a full ring, cursor mid-ring
    src.close()


def _torchrl_loads(paths, so):
    s = _storage(paths["buf"], so)
    try:
        s.loads(paths["src"])
    finally:
        s.close()


def _setup_torchrl_state_dict(paths, so):
    import torch
    from torchrl.data import LazyTensorStorage

    s = _storage(paths["buf"], so)
    _extend(s, 0, 4)
    s.close()
    lazy = LazyTensorStorage(TORCHRL_SLOTS)
    lazy.set(torch.arange(8), _rows(300, 8))
    os.makedirs(paths["src"], exist_ok=True)
    torch.save(lazy.state_dict(), f"{paths['src']}/sd.pt")


def _torchrl_state_dict(paths, so):
    import torch

    s = _storage(paths["buf"], so)
    try:
        s.load_state_dict(torch.load(f"{paths['src']}/sd.pt", weights_only=False))
    finally:
        s.close()


def _nd_storage(path, so=None):
    """An ``ndim=2`` ZarrStorage whose extends commit before they return."""
    from zreplay.torchrl import ZarrStorage

    return ZarrStorage(2 * TORCHRL_SLOTS, path, ndim=2, flush_each_extend=True, storage_options=so)


def _setup_torchrl_ndim(paths, so):
    _nd_storage(paths["buf"], so).close()  # its dims come with the first extend


def _torchrl_ndim_extend(paths, so):
    """The first extend of [2 envs, 13 steps]: dims and rows in one commit, the ring of
    10 slots wrapped and the segment's capacity fitted to it (evicting)."""
    import torch
    from tensordict import TensorDict
    from torchrl.data import TensorDictReplayBuffer

    g = torch.arange(26).view(2, 13)
    data = TensorDict({"g": g, "obs": g.float().unsqueeze(-1).expand(2, 13, 3).clone()}, [2, 13])
    s = _nd_storage(paths["buf"], so)
    try:
        TensorDictReplayBuffer(storage=s, batch_size=1).extend(data)
    finally:
        s.close()


def observe_torchrl(path, so, make=_storage) -> State:
    """A ZarrStorage's slots (its rows' ``g`` in slot order) reopened; verify clean."""
    s = make(path, so)
    try:
        n = s.shape[0] if len(s) else 0
        rows = s.get(list(range(n))) if n else None
        g = tuple(int(x) for x in rows["g"].reshape(-1).tolist()) if n else ()
        obs = rows["obs"][..., 0].reshape(-1).tolist() if n else []
        assert [float(x) for x in g] == obs, "a row's fields from different writes"
    finally:
        s.close()
    report = zreplay.verify(path, storage_options=so)
    assert report.ok, str(report)
    return State(g, (str(n),))


def observe_torchrl_dump(paths, so) -> State:
    """The dump at ``ckpt`` as a storage that loads it sees it."""
    tmp = paths["tmp"]
    s = _storage(tmp, so)
    try:
        s.loads(paths["ckpt"])
    finally:
        s.close()
    return observe_torchrl(tmp, so)


SCENARIOS = {
    # name: (setup, action, writer kwargs, observed path, prioritized)
    "add+flush": (_setup_buffer, _add, {}, "buf", False),
    "evict+reclaim": (
        lambda p, so: _setup_buffer(p, so, (0, 1, 2), capacity=54, layout={"rewards": SMALL}),
        _add, {"capacity": 54, "layout": {"rewards": SMALL}}, "buf", False,
    ),
    "clear": (lambda p, so: _setup_buffer(p, so, (0, 1, 2)), _clear, {}, "buf", False),
    "checkpoint over one": (_setup_ckpt, _save, {}, "ckpt", False),
    "load zreplay": (_setup_load_zreplay, _load, {}, "buf", False),
    "load rlinf": (_setup_load_rlinf, _load, {}, "buf", False),
    "priority save": (_setup_priorities, _reprioritize, {}, "buf", True),
    "export rlinf": (_setup_export, _export, {}, "rlinf", False),
    "dump hdf5": (_setup_export, _dump, {}, "hdf5", False),
    "append hdf5": (_setup_export, _append, {}, "hdf5", False),
    "priority save, spare copy damaged": (
        _setup_damaged_priorities("spare"), _reprioritize, {}, "buf", True,
    ),
    "priority save, named copy damaged": (
        _setup_damaged_priorities("named"), _add_prioritized, {"prioritized": True}, "buf", False,
    ),
    "lock takeover, stale": (_stale_lock(False), _add, {}, "buf", False),
    "lock takeover, other namespace": (_stale_lock(True), _add, {}, "buf", False),
    "lock held, second writer": (_setup_buffer, _contend_then_add, {}, "buf", False),
    "replacement's lock left, writer clears it": (
        _stale_lock(False, whole=True), _add, {}, "buf", False,
    ),
    "learner progress": (_setup_learner, _learn, {}, "progress", False),
    "torchrl dumps over one": (_setup_torchrl_dump, _torchrl_dump, {}, "torchrl dump", False),
    "torchrl loads": (_setup_torchrl_load, _torchrl_loads, {}, "torchrl", False),
    "torchrl state dict": (_setup_torchrl_state_dict, _torchrl_state_dict, {}, "torchrl", False),
    "torchrl ndim first extend": (
        _setup_torchrl_ndim, _torchrl_ndim_extend, {}, "torchrl ndim", False,
    ),
}  # fmt: skip
# Scenarios whose action is not a TrajectoryReplayBuffer's: act(paths, so) as it is.
DIRECT = {"progress", "torchrl", "torchrl dump", "torchrl ndim"}
TORCHRL = {
    "torchrl dumps over one", "torchrl loads", "torchrl state dict", "torchrl ndim first extend",
}  # fmt: skip
# Sweeps of the issue-20 scenarios run fewer points in CI (they repeat code paths the
# others cover at every point; ZREPLAY_FAULT_POINTS=all runs every call).
SMALLER = {
    "priority save, spare copy damaged", "priority save, named copy damaged",
    "lock takeover, stale", "lock takeover, other namespace", "lock held, second writer",
    "replacement's lock left, writer clears it", "learner progress", *TORCHRL,
}  # fmt: skip
LOCAL_ONLY = {"load rlinf", "export rlinf", "dump hdf5", "append hdf5", *TORCHRL}  # files
# An append extends an HDF5 file in place: rolled back when it raises, but HDF5 keeps no
# journal, so a crash in the middle is not covered (README, "Known limits").
ERROR_ONLY = {"append hdf5"}
S3_SCENARIOS = [
    "add+flush", "evict+reclaim", "clear", "checkpoint over one", "load zreplay",
    "priority save", "priority save, spare copy damaged", "lock takeover, stale",
    "replacement's lock left, writer clears it", "learner progress",
]  # fmt: skip


def act(name: str, paths: dict, so, before: State | None = None, after: State | None = None):
    _setup, action, kw, observed, prioritized = SCENARIOS[name]
    kw = dict(kw)
    writes_prio = kw.pop("prioritized", prioritized)  # a prioritized writer, however observed
    if observed in DIRECT:
        action(paths, so)
    elif observed == "buf":
        _act_on_buffer(paths, so, action, writes_prio, before, after, prioritized, **kw)
    else:
        _act_on_buffer(paths, so, action, **kw)


def look(observed: str, paths: dict, so, prioritized=False, used_ids=None) -> State:
    """The state of what a scenario's ``observed`` names (a buffer, an RLinf export, an
    HDF5 file)."""
    if observed == "progress":
        return observe_progress(paths, so)
    if observed == "torchrl":
        return observe_torchrl(paths["buf"], so)
    if observed == "torchrl dump":
        return observe_torchrl_dump(paths, so)
    if observed == "torchrl ndim":
        return observe_torchrl(paths["buf"], so, _nd_storage)
    if observed == "rlinf":
        return observe_rlinf(paths["ckpt"])
    if observed == "hdf5":
        return observe_hdf5(paths["src"])
    return observe(paths[observed], so, prioritized, used_ids)


def _crash_child(name: str, paths: dict, so, at: int) -> None:
    with Faults(at, "crash").installed():
        act(name, paths, so)


# -- the harness ----------------------------------------------------------------------


class Place:
    """Where one run of a scenario happens: a local directory or an S3 prefix holding
    ``buf``, ``ckpt``, ``src`` and ``tmp``; each run gets a copy of a template built once."""

    def __init__(self, kind: str, tmp_path, so):
        self.kind, self.tmp, self.so = kind, tmp_path, so

    def _base(self) -> str:
        tag = uuid.uuid4().hex[:8]
        return str(self.tmp / tag) if self.kind == "local" else f"s3://{S3_BUCKET}/faults/{tag}"

    @staticmethod
    def paths(base: str) -> dict:
        return {k: f"{base}/{k}" for k in ("buf", "ckpt", "src", "tmp")}

    def template(self, name: str) -> str:
        """A new base holding the before-state of scenario ``name``."""
        base = self._base()
        if self.kind == "local":
            os.makedirs(base)
        SCENARIOS[name][0](self.paths(base), self.so)
        return base

    def prepare(self, template: str) -> dict:
        """Paths holding a copy of ``template``."""
        base = self._base()
        if self.kind == "local":
            shutil.copytree(template, base)
        else:
            src, dst = locate(template, self.so), locate(base, self.so)
            for rel, loc in src.backend.walk_files(src):
                src.backend.copy(loc.key, (dst / rel).key)
        return self.paths(base)

    def cleanup(self, paths: dict) -> None:
        base = paths["buf"].rsplit("/", 1)[0]
        loc = locate(base, self.so)
        loc.backend.remove_tree(loc)


_BASELINES: dict = {}  # (scenario, place kind) -> (template, before, after, calls)


def baseline(name: str, place: Place) -> tuple:
    """The scenario's template, its before- and after-states, and how many store calls
    the operation makes (once per session and place: both modes share it)."""
    key = (name, place.kind)
    if key not in _BASELINES:
        _setup, _action, _kw, observed, prioritized = SCENARIOS[name]
        template = place.template(name)
        paths = place.prepare(template)
        before = look(observed, paths, place.so, prioritized)
        counter = Faults()
        with counter.installed():
            act(name, paths, place.so)
        HANDED_OUT.clear()
        after = look(observed, paths, place.so, prioritized)
        assert after != before
        place.cleanup(paths)
        _BASELINES[key] = (template, before, after, counter.calls)
    return _BASELINES[key]


def sweep(name: str, place: Place, mode: str, default_budget: int, points=None) -> dict:
    """Run scenario ``name`` with a fault at each chosen call (``points``, or a sample
    of the operation's calls); returns counts."""
    if name in LOCAL_ONLY and place.kind != "local":
        pytest.skip("RLinf directories and HDF5 files are local")
    if name in ERROR_ONLY and mode == "crash":
        pytest.skip("an HDF5 append is in place: HDF5 keeps no journal to survive a crash")
    _setup, _action, _kw, observed, prioritized = SCENARIOS[name]
    template, before, after, calls = baseline(name, place)
    chosen = points or injection_points(
        calls, budget(default_budget), seed=zlib.crc32(name.encode())
    )
    outcomes = {"calls": calls, "points": len(chosen), "raised": 0, "before": 0, "after": 0}
    outcomes["fired"] = []  # where each error fired (a crash: in the child)
    for at in chosen:
        paths = place.prepare(template)
        if mode == "error":
            faults = Faults(at, "error")
            try:
                with faults.installed():
                    act(name, paths, place.so, before, after)
            except (OSError, ZReplayError) as e:
                outcomes["raised"] += 1
                assert str(e), "an error without a message"
            # anything else (TypeError, AttributeError, ...) fails the test here
            outcomes["fired"].append(faults.fired)
        else:
            ctx = processes()
            p = ctx.Process(target=_crash_child, args=(name, paths, place.so, at))
            p.start()
            p.join(120)
            assert p.exitcode in (0, CRASH_STATUS), f"child exit code {p.exitcode} at call {at}"
            outcomes["raised"] += p.exitcode == CRASH_STATUS

        def used(state):  # ids once committed or handed to the caller
            return [*before.ids, *state.ids, *HANDED_OUT]

        try:
            state = look(observed, paths, place.so, prioritized, used)
        except BaseException as e:
            fired = faults.fired if mode == "error" else "(in the child)"
            e.add_note(f"after a {mode} at store call {at} of {calls}: {fired}")
            raise
        assert state in (before, after), (
            f"call {at} ({mode}): {state} is neither {before} nor {after}"
        )
        outcomes["before" if state == before else "after"] += 1
        HANDED_OUT.clear()
        place.cleanup(paths)
    return outcomes


def assert_injected(out: dict, mode: str) -> None:
    """The sweep injected what it says (a sweep that never fired would prove nothing):
    a crash ended a child; an error reached the caller, unless every point's error fired
    in a call the operation is built to outlive (a learner's best-effort progress
    publish, a background read that is retried): the state after each point was checked
    either way."""
    if mode == "crash":
        assert out["raised"] > 0, out
        return
    if out["raised"] > 0:
        return
    tolerated = ("S3Backend.put", "zreplay-s3io", "LocalBackend.publish")
    assert all(f and any(t in f for t in tolerated) for f in out["fired"]), out


@pytest.mark.parametrize("mode", ["error", "crash"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_local_operations_are_all_or_nothing(tmp_path_factory, name, mode, record_property):
    place = Place("local", tmp_path_factory.getbasetemp() / "faults", None)
    out = sweep(name, place, mode, default_budget=8 if name in SMALLER else 24)
    record_property("fault_sweep", out)
    print(f"\n{name} [{mode}] local: {out}")
    assert_injected(out, mode)


@pytest.mark.parametrize("mode", ["error", "crash"])
@pytest.mark.parametrize("name", sorted(S3_SCENARIOS))
def test_s3_operations_are_all_or_nothing(s3, name, mode, record_property):
    # The learner's sweep makes mostly calls it outlives by design (progress publishes,
    # retried reads): 3 points could all land there, so it takes 12.
    small = 12 if name == "learner progress" else 3
    out = sweep(name, Place("s3", None, s3), mode, default_budget=small if name in SMALLER else 4)
    record_property("fault_sweep", out)
    print(f"\n{name} [{mode}] s3: {out}")
    assert_injected(out, mode)


@pytest.mark.parametrize("mode", ["error", "crash"])
def test_a_writer_removing_a_replacements_left_lock_fails_whole_at_every_call(
    tmp_path_factory, mode
):
    """A writer opening a buffer finds the root lock an import or checkpoint save left
    when it died, and removes it (store/lock.py ``clear_if_gone``) before it makes
    anything: a fault at each of the open's first store calls, the lock's removal
    among them (the sweep above samples them), leaves the buffer as it was, and the
    next writer opens it."""
    name = "replacement's lock left, writer clears it"
    place = Place("local", tmp_path_factory.getbasetemp() / "faults-left-lock", None)
    out = sweep(name, place, mode, 0, points=list(range(1, 16)))
    assert out["before"] == 15, out  # a writer that failed to open added nothing
    if mode == "error":  # the removal itself was among the calls that failed
        assert sum("LocalPath.unlink" in f for f in out["fired"] if f) >= 1, out
    assert_injected(out, mode)


def test_the_harness_counts_and_fires(tmp_path):
    """The harness itself: it counts the calls of a known operation and the armed call
    raises (a harness that never fired would prove nothing)."""
    paths = Place.paths(str(tmp_path / "h"))
    counter = Faults()
    with counter.installed():
        with writer(paths["buf"], None) as buf:
            buf.add_trajectories([make_traj(0)])
    assert counter.calls > 10 and "LocalBackend.publish" in counter.names
    assert "Segment.write_rows" in counter.names
    with pytest.raises(OSError, match="injected I/O error at store call 1 "):
        with Faults(1, "error").installed():
            writer(paths["buf"], None)


def test_a_thread_left_running_before_the_harness_neither_counts_nor_takes_the_fault(tmp_path):
    """A reader an earlier test left running (a preload, a prefetch, a dropped buffer's
    close) keeps doing I/O while the next sweep runs: the fault meant for the operation
    must not land in it (CI saw a whole sweep's faults vanish that way under load)."""
    paths = Place.paths(str(tmp_path / "h"))
    with writer(paths["buf"], None) as buf:
        buf.add_trajectories([make_traj(0)])
    from zreplay.store.backend_local import LocalPath

    stop, spinning = threading.Event(), threading.Event()
    stray = LocalPath(paths["buf"]) / "zarr.json"

    def reread():
        while not stop.is_set():
            stray.read_bytes()
            spinning.set()

    left = threading.Thread(target=reread, name="zreplay-preload")
    left.start()
    try:
        spinning.wait(10)
        counter = Faults()
        with counter.installed():
            time.sleep(0.05)  # the stray thread reads all along
            LocalPath(paths["buf"]).joinpath("zarr.json").read_bytes()
        assert counter.calls == 1, counter.names[:5]
        with pytest.raises(OSError, match="at store call 1 "):
            with Faults(1, "error").installed():
                time.sleep(0.05)
                LocalPath(paths["buf"]).joinpath("zarr.json").read_bytes()
    finally:
        stop.set()
        left.join()
