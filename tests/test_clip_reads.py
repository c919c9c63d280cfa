"""Clips of image keys read through the column caches: a view keeps the newest rows of
its large keys (images) decoded in a column cache file of their own, beside the one of
its small keys, and serves clips from both with one fancy index per key.

Every value written here encodes where it came from (``code = tid * 100 + lane * 20 +
step``, in the actions and in every pixel of a frame), so each test checks that a clip
holds exactly the stored rows, in order, inside one episode: with the caches cold, warm
(filled by another view), stale (the writer added, cleared or evicted since), holding
only the newest rows, or off; for image keys stored zstd and PNG.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import zreplay
from zreplay.engine.colcache import large_keys

H = W = 24  # 1,728-byte frames: above the small rows' 1 KiB, so a large key
T, B = 10, 3
IMG = ("curr_obs", "main_images")
CODECS = {"zstd": None, "png": {"codec": "png"}}


@pytest.fixture(autouse=True)
def cols(tmp_path, monkeypatch):
    d = tmp_path / "cols"
    monkeypatch.setenv("ZREPLAY_CACHE_DIR", str(d))
    return d


@pytest.fixture(params=sorted(CODECS))
def codec(request):
    return request.param


def frames(code: np.ndarray) -> np.ndarray:
    """uint8 ``[..., H, W, 3]`` frames of int ``code`` ``[...]`` (< 65,536): the code in
    channels 0 and 1, a pattern that depends on it in channel 2."""
    c = np.asarray(code, np.int64)[..., None, None]
    yy, xx = np.mgrid[:H, :W]
    out = np.empty((*c.shape[:-2], H, W, 3), np.uint8)
    out[..., 0] = c & 255
    out[..., 1] = (c >> 8) & 255
    out[..., 2] = (xx + 3 * yy + c) & 255
    return out


def trajectory(tid: int) -> dict:
    """RLinf-like ``[T, B]`` columns; lane 0 ends an episode at step 4 as well."""
    code = tid * 100 + np.arange(B)[None, :] * 20 + np.arange(T)[:, None]
    dones = np.zeros((T, B, 1), bool)
    dones[-1] = True
    dones[4, 0] = True
    return {
        "actions": np.repeat(code[..., None], 2, -1).astype(np.float32),
        "dones": dones,
        "terminations": dones.copy(),
        "curr_obs": {"main_images": frames(code)},
    }


def write(path, tids, codec="zstd", **kw) -> zreplay.TrajectoryReplayBuffer:
    layout = None if CODECS[codec] is None else {"/".join(IMG): dict(CODECS[codec])}
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), layout=layout, **kw
    )
    for tid in tids:
        buf.add_trajectories([trajectory(tid)])
    buf.flush()  # committed: what a view sees
    return buf


def check(clips: dict, h: int, tids=None) -> np.ndarray:
    """Every clip ``[n, h, ...]`` holds stored rows: frames equal to the actions' codes,
    consecutive steps of one lane that no episode end splits; returns the codes."""
    img = np.asarray(clips[IMG[0]][IMG[1]])
    act = np.asarray(clips["actions"])
    code = act[..., 0].astype(np.int64)
    assert img.shape == (code.shape[0], h, H, W, 3)
    np.testing.assert_array_equal(img, frames(code))
    np.testing.assert_array_equal(np.diff(code, axis=1), 1)  # consecutive, one lane
    step = code % 20
    assert not ((step[:, :-1] == 4) & (code[:, :-1] // 20 % 5 == 0)).any()  # lane 0's end
    if tids is not None:
        assert set(np.unique(code // 100)) <= set(tids)
    return code


def large_cache(view):
    (part,) = view.core.engine.snapshot().parts
    (cache,) = [c for c in part.caches if c is not part.cache]
    return cache


def test_a_view_keeps_its_images_in_a_column_cache_file(tmp_path, codec):
    write(tmp_path / "b", range(6), codec).close()
    view = zreplay.open(tmp_path / "b", seed=0)
    check(view.sample_clips(64, history_len=4), 4)  # cold: this read fills it
    cache = large_cache(view)
    assert cache.keys == large_keys(view.core.engine.schema) == ["curr_obs/main_images"]
    assert cache.path is not None and cache.path.is_file()
    assert cache.lo == 0 and cache.hi == view.num_rows
    for _ in range(3):  # warm: from the file
        check(view.sample_clips(64, history_len=4), 4)
    n = view.num_clips(history_len=4)
    got = view.clips(np.arange(n), history_len=4)  # every clip, in order
    codes = check(got, 4)
    assert len(np.unique(codes[:, 0])) == n


def test_a_second_view_serves_the_file_another_filled(tmp_path, codec):
    write(tmp_path / "b", range(5), codec).close()
    first = zreplay.open(tmp_path / "b", seed=0)
    check(first.sample_clips(32, history_len=3), 3)
    second = zreplay.open(tmp_path / "b", seed=1)
    a = second.sample_clips(256, history_len=3)
    check(a, 3)
    assert large_cache(second).path == large_cache(first).path
    off = zreplay.open(tmp_path / "b", seed=1, column_cache_bytes=0)
    b = off.sample_clips(256, history_len=3)  # no cache at all: from the store
    for k in ("actions",):
        np.testing.assert_array_equal(a[k], b[k])
    np.testing.assert_array_equal(a["curr_obs"]["main_images"], b["curr_obs"]["main_images"])
    assert not off.core.engine.snapshot().parts[0].caches


def test_rows_added_since_are_read_after_a_refresh(tmp_path, codec):
    buf = write(tmp_path / "b", range(3), codec)
    view = zreplay.open(tmp_path / "b", seed=0)
    check(view.sample_clips(64, history_len=5), 5, tids=range(3))
    buf.add_trajectories([trajectory(tid) for tid in (3, 4)])
    buf.flush()
    # A snapshot until refresh(): its clips are the rows it showed.
    check(view.sample_clips(64, history_len=5), 5, tids=range(3))
    view.refresh()
    codes = check(view.clips(np.arange(view.num_clips(5)), history_len=5), 5)
    assert set(np.unique(codes // 100)) == set(range(5))
    assert large_cache(view).hi == view.num_rows
    buf.close()


def test_a_cleared_and_rewritten_buffer_is_never_served_from_the_old_file(tmp_path, codec):
    buf = write(tmp_path / "b", range(4), codec)
    view = zreplay.open(tmp_path / "b", seed=0)
    check(view.sample_clips(64, history_len=3), 3, tids=range(4))
    old = large_cache(view).path
    buf.clear()
    for tid in (40, 41, 42, 43):  # the same row numbers, other frames
        buf.add_trajectories([trajectory(tid)])
    buf.flush()
    view.refresh()
    codes = check(view.clips(np.arange(view.num_clips(3)), history_len=3), 3)
    assert set(np.unique(codes // 100)) == {40, 41, 42, 43}
    assert large_cache(view).path != old and not old.exists()
    buf.close()


def test_evicted_rows_are_never_served(tmp_path, codec):
    buf = write(tmp_path / "b", range(3), codec, capacity=3 * T * B)
    view = zreplay.open(tmp_path / "b", seed=0)
    check(view.sample_clips(64, history_len=4), 4, tids=range(3))
    for tid in range(3, 9):
        buf.add_trajectories([trajectory(tid)])
    buf.flush()
    view.refresh()
    live = set(range(6, 9))
    codes = check(view.clips(np.arange(view.num_clips(4)), history_len=4), 4)
    assert set(np.unique(codes // 100)) == live
    for _ in range(5):
        check(view.sample_clips(128, history_len=4), 4, tids=live)
    assert large_cache(view).lo >= buf.core.engine.commit.low_row
    buf.close()


def test_a_cache_holding_only_the_newest_rows_reads_the_others_from_the_store(tmp_path, codec):
    write(tmp_path / "b", range(6), codec).close()
    budget = 2 * T * B * H * W * 3  # two trajectories' frames
    view = zreplay.open(tmp_path / "b", seed=0, chunk_cache_bytes=budget)
    codes = check(view.clips(np.arange(view.num_clips(4)), history_len=4), 4)
    assert set(np.unique(codes // 100)) == set(range(6))
    cache = large_cache(view)
    assert 0 < cache.lo < view.num_rows and cache.hi == view.num_rows
    for _ in range(5):  # clips of held and of older rows in one batch
        check(view.sample_clips(128, history_len=4), 4)


def test_every_facade_serves_the_stored_rows(tmp_path, codec):
    buf = write(tmp_path / "b", range(5), codec)
    check(buf.sample_clips(64, history_len=4), 4)  # the writer's own (torch tensors)
    buf.close()
    view = zreplay.open(tmp_path / "b", seed=0)
    check(view.sample_clips(64, history_len=4), 4)
    data = zreplay.ClipDataset(view, history_len=4)
    items = [data[i] for i in range(0, len(data), 7)]
    batch = {k: np.stack([it[k] for it in items]) for k in ("actions",)}
    batch["curr_obs"] = {"main_images": np.stack([it["curr_obs"]["main_images"] for it in items])}
    check(batch, 4)
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    check(next(iter(loader)), 4)


def test_stable_worldmodel_clips_from_disk(tmp_path, codec):
    layout = None if CODECS[codec] is None else {"pixels": dict(CODECS[codec])}
    rb = zreplay.ReplayBuffer(
        max_steps=10_000, path=tmp_path / "swm", layout=layout, ram_budget_bytes=0
    )
    for e in range(12):
        L = 5 + e % 4
        code = e * 100 + np.arange(L)
        rb.write_episode({"pixels": frames(code), "action": code[:, None].astype(np.float32)})
    rb.flush()
    for source in (rb, zreplay.open(tmp_path / "swm", seed=0)):
        got = (
            source.sample(64, history_len=3)
            if source is rb
            else source.sample_clips(64, history_len=3)
        )
        code = np.asarray(got["action"])[..., 0].astype(np.int64)
        np.testing.assert_array_equal(np.asarray(got["pixels"]), frames(code))
        np.testing.assert_array_equal(np.diff(code, axis=1), 1)  # one episode each
    rb.close()


def test_episode_reads_never_fill_the_image_cache(tmp_path, codec):
    write(tmp_path / "b", range(4), codec).close()
    view = zreplay.open(tmp_path / "b", seed=0)
    ep = view.episode(1)  # an export's or a plot's read: straight from the store
    code = ep["actions"][:, 0].astype(np.int64)
    np.testing.assert_array_equal(ep["curr_obs"]["main_images"], frames(code))
    assert large_cache(view).hi == 0  # nothing decoded into it
    check(view.sample_clips(16, history_len=3), 3)  # a draw fills it
    assert large_cache(view).hi == view.num_rows
    again = view.episode(1)  # served from it now that it holds those rows
    np.testing.assert_array_equal(again["curr_obs"]["main_images"], frames(code))
