"""The read path: clips bit for bit, chunk cache, damaged chunks on clip reads, a view
retrying rows evicted under it, batched episode and trajectory reads (column cache:
test_colcache.py; exports: test_export.py; checkpoints: test_checkpoint.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import shard_files

import zreplay
from zreplay import CorruptBufferError
from zreplay.samplers import PrioritizedClips
from zreplay.sampling.clips import ClipSpec, plan_clips


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
