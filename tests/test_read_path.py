"""The read path: column cache, chunk cache, reads without scatter, batched episode and
trajectory reads, HDF5 chunks written directly, background RAM-tier refill after a load."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr
from conftest import check_rows, make_traj, shard_files

import zreplay
from zreplay import CorruptBufferError
from zreplay.samplers import PrioritizedClips
from zreplay.sampling.clips import ClipSpec, plan_clips


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """12 trajectories [6, 3] (every value encodes trajectory, lane, step) on disk."""
    path = tmp_path_factory.mktemp("read") / "buf"
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path)) as buf:
        buf.add_trajectories([make_traj(i) for i in range(12)])
    return path


def plain_rows(path: Path, key: str) -> np.ndarray:
    """Every committed row of ``key``, read with zarr alone (the reference)."""
    seg = zarr.open_group(str(path), mode="r")["segments/default"]
    return seg[f"data/{key}"][: int(seg["offsets"][12])]


def flat(batch: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in batch.items():
        out.update(flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {prefix + k: v})
    return out


@pytest.mark.parametrize(
    "caches",
    [{}, {"column_cache_bytes": 0, "chunk_cache_bytes": 0}, {"chunk_cache_bytes": 1 << 24}],
)
def test_clips_are_the_stored_rows_bit_for_bit(stored, caches):
    view = zreplay.open(stored, **caches)
    n = view.num_clips(history_len=2)
    idx = np.random.default_rng(0).integers(0, n, 64)
    got = flat(view.clips(idx, history_len=2))
    plan = plan_clips(view.episodes(), ClipSpec(2), idx, view.keys())  # rows, not data
    for key in view.keys():
        ref = plain_rows(stored, key)[plan.rows[key]]
        assert got[key].dtype == ref.dtype and np.array_equal(got[key], ref), key
    # repeats of one clip inside a batch come back as copies of the same rows
    twice = flat(view.clips([3, 3, 5], history_len=2))
    assert all(np.array_equal(v[0], v[1]) for v in twice.values())


def test_column_cache_serves_small_keys_and_follows_refresh(stored, tmp_path):
    import shutil

    path = tmp_path / "buf"
    shutil.copytree(stored, path)
    view = zreplay.open(path, seed=1)
    check_rows(view.sample(200))
    seg = view.core.engine.snapshot().parts[0]
    assert seg.cache is not None and set(seg.cache.keys) >= {"rewards", "actions"}
    assert "curr_obs/main_images" in seg.cache.keys  # 8x8x3 images are 192 B: small too
    assert seg.cache.hi == view.num_rows  # filled on first use
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path)) as buf:
        buf.add_trajectories([make_traj(i) for i in range(12, 15)])
    assert view.refresh()
    clips = flat(view.clips(np.arange(view.num_clips(history_len=2)), history_len=2))
    codes = clips["rewards"][..., 0]
    assert {int(c) // 10000 for c in codes.ravel()} == set(range(15))  # new rows seen
    assert np.array_equal(clips["curr_obs/states"][..., 0], codes)
    assert seg.cache is view.core.engine.snapshot().parts[0].cache  # same rows: kept


def test_small_column_budget_holds_only_the_newest_rows(stored, tmp_path):
    import shutil

    stored = shutil.copytree(stored, tmp_path / "own")  # its own cache file, filled here
    view = zreplay.open(stored, column_cache_bytes=4096)
    batch = view.rows(np.arange(view.num_rows))
    for key in view.keys():
        assert np.array_equal(flat(batch)[key], plain_rows(stored, key)), key
    cache = view.core.engine.snapshot().parts[0].cache
    assert 0 < cache.hi - cache.lo < view.num_rows and cache.nbytes <= 4096


def test_writer_reads_old_small_rows_from_its_column_cache(tmp_path):
    with zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(tmp_path / "b"), cache_size=1, sample_window_size=0
    ) as buf:
        buf.add_trajectories([make_traj(i) for i in range(8)])
        buf.flush()
        for _ in range(5):
            check_rows(buf.sample(128))
        clips = buf.sample_clips(64, history_len=3)
        r = clips["rewards"][..., 0].numpy()
        assert np.all(np.diff(r, axis=1) == 1)  # consecutive steps of one lane
        assert np.array_equal(clips["curr_obs"]["states"][..., 0].numpy(), r)
        part = buf.core.engine.snapshot().parts[0]
        assert part.cache is not None and part.cache.hi > part.cache.lo  # it was used


def test_nstep_and_prioritized_clips_agree_with_and_without_caches(stored, tmp_path):
    rng = np.random.default_rng(0)
    with zreplay.ReplayBuffer(10_000, path=tmp_path / "eps") as rb:
        for L in rng.integers(3, 30, 40):
            rb.write_episode(
                {
                    "obs": rng.standard_normal((L, 5)).astype(np.float32),
                    "pixels": rng.integers(0, 255, (L, 16, 16, 3), dtype=np.uint8),
                    "reward": rng.standard_normal(L).astype(np.float32),
                    "terminated": np.arange(L) == L - 1,
                }
            )
    a = zreplay.open(tmp_path / "eps", seed=3)
    b = zreplay.open(tmp_path / "eps", seed=3, column_cache_bytes=0)
    for _ in range(3):
        x = flat(a.sample_nstep(100, n=3, gamma=0.9, obs_key="obs", frame_stack=2))
        y = flat(b.sample_nstep(100, n=3, gamma=0.9, obs_key="obs", frame_stack=2))
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
    p = zreplay.open(stored, seed=4, sampler=PrioritizedClips(history_len=3))
    q = zreplay.open(stored, seed=4, sampler=PrioritizedClips(history_len=3), column_cache_bytes=0)
    u, v = flat(p.sample(50)), flat(q.sample(50))
    assert all(np.array_equal(u[k], v[k]) for k in u)
    assert np.all(np.diff(u["rewards"][..., 0], axis=1) == 1)


def _flip_first_shard(root: Path, key: str) -> None:
    f = shard_files(root, key)[0]
    data = bytearray(f.read_bytes())
    data[len(data) // 3] ^= 0x40
    f.write_bytes(bytes(data))


@pytest.mark.parametrize("budget", [None, 0])
@pytest.mark.parametrize("key", ["rewards", "curr_obs/main_images"])
def test_damaged_chunks_still_raise_on_clip_reads(stored, tmp_path, key, budget):
    import shutil

    root = tmp_path / "buf"
    shutil.copytree(stored, root)
    _flip_first_shard(root, key)
    view = zreplay.open(root, column_cache_bytes=budget)
    with pytest.raises(CorruptBufferError, match=key):
        for _ in range(20):
            view.sample_clips(32, history_len=3)
    with pytest.raises(CorruptBufferError, match=key):
        view.rows(np.arange(view.num_rows))


def coded(tid: int, T: int = 6, B: int = 3) -> dict:
    """[T, B] rows whose every value encodes (tid, lane, step); ``frame`` rows (1,728 B)
    are too large for the column cache, the rest are small."""
    code = tid * 10000 + np.arange(B)[None, :] * 100 + np.arange(T)[:, None]
    return {
        "rewards": code[..., None].astype(np.float32),
        "actions": np.repeat(code[..., None], 3, -1).astype(np.float32),
        "frame": np.broadcast_to(
            (code % 251).astype(np.uint8)[..., None, None, None], (T, B, 24, 24, 3)
        ).copy(),
        "terminations": np.zeros((T, B, 1), bool),
    }


def test_view_retries_when_rows_it_reads_from_disk_were_evicted(tmp_path):
    path = tmp_path / "buf"
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), capacity=90, cache_size=2,
        layout={"frame": {"chunk_rows": 1, "shard_rows": 6}},
    )  # fmt: skip
    buf.add_trajectories([coded(i) for i in range(5)])
    buf.flush()
    view = zreplay.open(path, seed=0)
    view.sample_clips(8, history_len=3)  # the column cache now holds trajectories 0..4
    cache = view.core.engine.snapshot().parts[0].cache
    assert set(cache.keys) == {"rewards", "actions", "terminations"} and cache.hi == 90
    buf.add_trajectories([coded(i) for i in range(5, 12)])
    buf.flush()  # 0..6 evicted, their frame shards deleted
    seen = set()
    for _ in range(10):  # the stale snapshot's frame reads fail: refreshed and drawn again
        c = view.sample_clips(16, history_len=3)
        r = c["rewards"][..., 0]
        assert np.all(np.diff(r, axis=1) == 1)
        assert np.array_equal(c["frame"][..., 0, 0, 0], (r % 251).astype(np.uint8))
        assert np.array_equal(c["actions"][..., 2], r)
        seen |= {int(x) // 10000 for x in r.ravel()}
    assert seen and min(seen) >= 7
    assert cache is view.core.engine.snapshot().parts[0].cache and cache.lo >= 7 * 18
    buf.close()


# -- batched reads: dumps and exports -------------------------------------------------


def test_episode_batches_and_trajectories_match_single_reads(stored):
    view = zreplay.open(stored)
    cols, table = view.core.episodes_from(0, batch_bytes=2000)  # a few episodes
    k = len(table["length"])
    assert 1 <= k < view.num_episodes
    at = 0
    for e in range(k):
        one = view.core.episode(e)
        L = int(table["length"][e])
        assert all(np.array_equal(cols[key][at : at + L], one[key]) for key in one)
        at += L
    recs = list(view.core.trajectories(batch_bytes=3000))
    assert [r.trajectory_id for r in recs] == list(range(12))
    for i in (0, 7, 11):
        one = view.core.trajectory(i)
        assert all(np.array_equal(recs[i].columns[c], one.columns[c]) for c in one.columns)


def _episodes(path: Path) -> list[dict]:
    return [flat(e) for e in zreplay.iter_hdf5(path)]


@pytest.mark.parametrize("compression", ["gzip", None, "lzf"])
def test_hdf5_dump_is_what_h5py_itself_writes(stored, tmp_path, compression):
    view = zreplay.open(stored)
    out = tmp_path / "e.h5"
    ticks = []
    zreplay.dump(view, out, compression=compression, progress=ticks.append)
    assert sum(ticks) == view.num_episodes
    eps = _episodes(out)
    assert len(eps) == view.num_episodes
    for e in (0, 5, view.num_episodes - 1):
        ref = flat(view.episode(e))
        assert all(np.array_equal(eps[e][k], ref[k]) for k in ref)
    with h5py.File(out) as f:
        ds = f["curr_obs.states"]  # nested keys are root datasets named with "."
        assert ds.compression == compression and ds.shuffle == bool(compression)
        assert ds.chunks[0] > 1
        # the same data written by h5py reads back identically through the same filters
        ref = tmp_path / "ref.h5"
        with h5py.File(ref, "w") as g:
            kw = {"compression": compression, "shuffle": True} if compression else {}
            g.create_dataset("x", data=ds[:], chunks=ds.chunks, maxshape=ds.maxshape, **kw)
        with h5py.File(ref) as g:
            assert np.array_equal(g["x"][:], ds[:]) and g["x"].shuffle == ds.shuffle


def test_hdf5_append_continues_a_partial_chunk(stored, tmp_path):
    view = zreplay.open(stored)
    out = tmp_path / "e.h5"
    zreplay.dump(view, out)
    zreplay.dump(view, out, mode="append")
    eps = _episodes(out)
    n = view.num_episodes
    assert len(eps) == 2 * n
    for e in (0, n - 1):
        assert all(np.array_equal(eps[e][k], eps[n + e][k]) for k in eps[e])
    with h5py.File(out) as f:
        assert f["ep_offset"][n] == f["ep_len"][:n].sum()


def test_export_pt_writes_every_trajectory(stored, tmp_path):
    import torch

    view = zreplay.open(stored)
    from zreplay.compat.rlinf_files import export_rlinf

    assert export_rlinf(view.core, tmp_path / "r", "pt", 1) == 12
    files = sorted((tmp_path / "r").glob("trajectory_*.pt"))
    assert len(files) == 12 and not list((tmp_path / "r").glob("*.tmp"))
    t5 = torch.load(next(f for f in files if f.name.startswith("trajectory_5_")), weights_only=True)
    assert np.array_equal(t5["rewards"].numpy(), view.trajectory(5)["rewards"])


# -- checkpoints ------------------------------------------------------------------------


def test_column_cache_knobs(stored, tmp_path):
    def cache(obj):
        return obj.core.engine.snapshot().parts[0].cache

    assert cache(zreplay.open(stored, column_cache_bytes=0)) is None
    c = cache(zreplay.open(stored))
    specs = zreplay.open(stored).schema.specs
    from zreplay.engine.colcache import default_budget

    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert default_budget() == ram  # the default budget is the machine's RAM
    assert zreplay.open(stored).core.engine.chunk_cache_bytes == ram // 16
    assert zreplay.open(stored, chunk_cache_bytes=0).core.engine.chunk_cache_bytes == 0
    assert c.max_rows == ram // sum(specs[k].row_bytes for k in c.keys)
    assert all(specs[k].row_bytes <= 1024 for k in c.keys)
    path = str(tmp_path / "b")
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buf:
        buf.add_trajectories([make_traj(0)])
        assert cache(buf) is not None
    with zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, enable_cache=False
    ) as buf:
        assert cache(buf) is None  # RAM tier off: every committed row is read from disk
