"""export_lerobot judged by LeRobot 0.4.4's own reader (``LeRobotDataset(repo_id,
root=...)``, offline, ``video_backend="pyav"``) in its own environment
(tests/lerobot_judge.py): the same episodes, lengths and items; PNG images exact,
AV1 video within its loss (PSNR printed); exported then imported exact in image mode."""

from __future__ import annotations

import json

import numpy as np
import pytest
from lerobot_judge import ENV_VAR, judge_python, run_judge_source

import zreplay

pytest.importorskip("pyarrow")
pytest.importorskip("av")

FRONT, WRIST = "observation.images.front", "observation.images.wrist"
LENGTHS = (6, 9, 4, 11)
FPS = 10

# LeRobot's items, stacked: {feature: [N, ...]} (cameras back to uint8 HWC), plus the
# episodes table and the task of every item.
READ = r"""
import json, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

root, out = sys.argv[1], sys.argv[2]
ds = LeRobotDataset("local/zreplay-export", root=root, video_backend="pyav")
cameras = set(ds.meta.camera_keys)
items = [ds[i] for i in range(len(ds))]
arrays = {}
for key in items[0]:
    if key == "task":
        continue
    v = np.stack([it[key].numpy() for it in items])
    if key in cameras:  # float CHW in [0, 1] -> uint8 HWC
        v = np.round(v.transpose(0, 2, 3, 1) * 255).astype(np.uint8)
    arrays[key] = v
np.savez(out, **arrays)
meta = {
    "len": len(ds),
    "lengths": [int(x) for x in ds.meta.episodes["length"]],
    "tasks": [it["task"] for it in items],
    "cameras": sorted(cameras),
    "video_keys": sorted(ds.meta.video_keys),
}
print(json.dumps(meta))
"""


# Action chunks as a policy asks for them: LeRobot's delta_timestamps, which it resolves
# with the episodes' dataset_from_index / dataset_to_index (padding past an episode's end).
CHUNKS = r"""
import sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

root, out = sys.argv[1], sys.argv[2]
ds = LeRobotDataset("local/zreplay-export", root=root, video_backend="pyav",
                    delta_timestamps={"action": [0.0, 0.1, 0.2]})
items = [ds[i] for i in range(len(ds))]
np.savez(out, action=np.stack([it["action"].numpy() for it in items]),
         pad=np.stack([it["action_is_pad"].numpy() for it in items]))
"""


def frames(n: int, seed: int, h: int = 48, w: int = 64) -> np.ndarray:
    """Moving gradients with a little noise: what a codec sees in a camera, uint8."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    t = np.arange(n)[:, None, None]
    img = np.stack([(x * 3 + t * 4 + seed * 20), (y * 5 + t * 2), (x + y + t * 6)], axis=-1)
    noise = rng.integers(0, 6, img.shape)
    return ((img + noise) % 256).astype(np.uint8)


def episode(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        FRONT: frames(n, seed),
        WRIST: frames(n, seed + 100),
        "observation": {"state": rng.standard_normal((n, 6)).astype(np.float32)},
        "action": rng.standard_normal((n, 3)).astype(np.float32),
        "rewards": rng.random(n).astype(np.float32),
        "terminated": np.arange(n) == n - 1,
    }


@pytest.fixture
def buf(tmp_path):
    path = tmp_path / "buf"
    rb = zreplay.ReplayBuffer(1000, path=str(path))
    for i, n in enumerate(LENGTHS):
        rb.write_episode(episode(n, i))
    rb.close()
    return path


def lerobot_read(root, tmp_path):
    out = tmp_path / "items.npz"
    meta = json.loads(run_judge_source(READ, root, out, scratch=tmp_path).splitlines()[-1])
    return meta, dict(np.load(out))


def expected() -> dict[str, np.ndarray]:
    eps = [episode(n, i) for i, n in enumerate(LENGTHS)]
    return {
        FRONT: np.concatenate([e[FRONT] for e in eps]),
        WRIST: np.concatenate([e[WRIST] for e in eps]),
        "observation.state": np.concatenate([e["observation"]["state"] for e in eps]),
        "action": np.concatenate([e["action"] for e in eps]),
        "next.reward": np.concatenate([e["rewards"] for e in eps]),
        "next.done": np.concatenate([e["terminated"] for e in eps]),
        "episode_index": np.repeat(np.arange(len(LENGTHS)), LENGTHS),
        "frame_index": np.concatenate([np.arange(n) for n in LENGTHS]),
    }


def check_items(meta, got, exact_cameras: bool) -> dict[str, float]:
    assert meta["len"] == sum(LENGTHS)
    assert meta["lengths"] == list(LENGTHS)
    want = expected()
    for key in ("observation.state", "action", "next.reward", "next.done"):
        np.testing.assert_array_equal(got[key].reshape(want[key].shape), want[key], err_msg=key)
    np.testing.assert_array_equal(got["episode_index"], want["episode_index"])
    np.testing.assert_array_equal(got["frame_index"], want["frame_index"])
    np.testing.assert_array_equal(got["index"], np.arange(sum(LENGTHS)))
    np.testing.assert_allclose(got["timestamp"], want["frame_index"] / FPS, atol=1e-6)
    psnr = {}
    for cam in (FRONT, WRIST):
        if exact_cameras:
            np.testing.assert_array_equal(got[cam], want[cam], err_msg=cam)
        else:
            mse = np.mean((got[cam].astype(np.float64) - want[cam]) ** 2)
            psnr[cam] = 10 * np.log10(255**2 / mse)
    return psnr


@pytest.mark.slow
def test_image_export_loads_in_lerobot_item_for_item_exactly(buf, tmp_path):
    root = tmp_path / "ds"
    tasks = ["pick", "place", "pick", "push"]
    zreplay.export_lerobot(buf, root, fps=FPS, images="image", task=tasks)
    meta, got = lerobot_read(root, tmp_path)
    assert meta["video_keys"] == [] and meta["cameras"] == [FRONT, WRIST]
    check_items(meta, got, exact_cameras=True)
    assert meta["tasks"] == [t for t, n in zip(tasks, LENGTHS, strict=True) for _ in range(n)]

    run_judge_source(CHUNKS, root, tmp_path / "chunks.npz", scratch=tmp_path)
    chunks = np.load(tmp_path / "chunks.npz")
    action = expected()["action"]
    last = np.repeat(np.cumsum(LENGTHS) - 1, LENGTHS)
    ahead = np.arange(len(action))[:, None] + np.arange(3)  # [N, 3] rows asked for
    np.testing.assert_array_equal(chunks["action"], action[np.minimum(ahead, last[:, None])])
    np.testing.assert_array_equal(chunks["pad"], ahead > last[:, None])


@pytest.mark.slow
def test_video_export_loads_in_lerobot_within_av1_loss(buf, tmp_path, monkeypatch):
    from zreplay.compat import lerobot_export

    monkeypatch.setattr(lerobot_export, "EPISODES_PER_FILE", 3)
    root = tmp_path / "ds"
    # Small files: episodes spread over several mp4s, parquet and episodes files.
    zreplay.export_lerobot(
        buf, root, fps=FPS, images="video", data_file_size_mb=0.002, video_file_size_mb=0.002
    )
    assert len(list((root / "videos" / FRONT).glob("chunk-*/file-*.mp4"))) > 1
    assert len(list((root / "meta/episodes").glob("chunk-*/file-*.parquet"))) == 2
    meta, got = lerobot_read(root, tmp_path)
    assert meta["video_keys"] == [FRONT, WRIST]
    psnr = check_items(meta, got, exact_cameras=False)
    print(f"AV1 (crf 30) PSNR as LeRobot decodes it: {psnr}")
    # LeRobot's own encode_video_frames gets the same PSNR on these frames (28.5 dB on
    # the wrist's wrapping gradients, 38.9 on the front's, measured on one episode): the
    # floor is AV1 crf 30's loss, not a colour or timing mistake (those score < 15).
    assert all(p > 27 for p in psnr.values()), psnr


@pytest.mark.slow
def test_exported_then_imported_is_exact_in_image_mode(buf, tmp_path):
    root = tmp_path / "ds"
    zreplay.export_lerobot(buf, root, fps=FPS, images="image")
    zreplay.import_lerobot(root, tmp_path / "back")
    view = zreplay.open(tmp_path / "back")
    assert list(view.core.episode_table()["length"]) == list(LENGTHS)
    want = expected()
    rows = view.core.rows(np.arange(view.num_rows))
    # next.reward / next.done (shape (1,) in LeRobot) come back as scalar rows.
    renamed = {"next.reward": "rewards", "next.done": "terminated"}
    for key in (FRONT, WRIST, "observation.state", "action", "next.reward", "next.done"):
        got = np.asarray(rows[renamed.get(key, key)])
        assert got.shape == want[key].shape, key
        np.testing.assert_array_equal(got, want[key], err_msg=key)


def test_without_the_judge_environment_the_judge_tests_skip_and_say_why(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"{ENV_VAR} is unset.*lerobot-env"):
        judge_python()
