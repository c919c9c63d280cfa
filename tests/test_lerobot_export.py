"""export_lerobot in the project's own environment: the v3.0 files it writes (checked with
pyarrow and PyAV, not LeRobot: tests/test_lerobot_export_judge.py runs LeRobot's reader),
their stats, rollover between episodes, and what it refuses."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest

import zreplay
from zreplay.errors import DestinationError, EmptyBufferError, SchemaError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
av = pytest.importorskip("av")
Image = pytest.importorskip("PIL.Image")

CAM = "observation.images.front"


def smooth_frames(n: int, h: int = 32, w: int = 48, seed: int = 0) -> np.ndarray:
    """Frames a video codec keeps well (gradients that move), uint8 [n, h, w, 3]."""
    y, x = np.mgrid[0:h, 0:w]
    t = np.arange(n)[:, None, None] + seed * 7
    r = (x * 4 + t * 3) % 256
    g = (y * 6 + t * 5) % 256
    b = ((x + y) * 2 + t) % 256
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def episode(n: int, seed: int, ended: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        CAM: smooth_frames(n, seed=seed),
        "observation": {"state": rng.standard_normal((n, 4)).astype(np.float32)},
        "action": rng.standard_normal((n, 2)).astype(np.float32),
        "rewards": np.arange(n, dtype=np.float32) + seed,
        "terminated": (np.arange(n) == n - 1) & ended,
    }


LENGTHS = (5, 7, 4)


@pytest.fixture
def buf(tmp_path):
    path = tmp_path / "buf"
    rb = zreplay.ReplayBuffer(1000, path=str(path))
    for i, n in enumerate(LENGTHS):
        rb.write_episode(episode(n, i))
    rb.close()
    return path


def read_data(root) -> dict[str, list]:
    files = sorted((root / "data").glob("chunk-*/file-*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pydict()


def episodes_table(root) -> list[dict]:
    files = sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()


def test_image_export_writes_the_v3_layout_with_every_frame_exact(buf, tmp_path):
    out = tmp_path / "ds"
    report = zreplay.export_lerobot(buf, out, fps=10, images="image", task="pick the cube")
    assert (report.episodes, report.frames) == (3, sum(LENGTHS))
    info = json.loads((out / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, 16, 1)
    assert info["fps"] == 10 and info["splits"] == {"train": "0:3"}
    assert info["video_path"] is None
    feats = info["features"]
    assert feats[CAM] == {
        "dtype": "image",
        "shape": [32, 48, 3],
        "names": ["height", "width", "channels"],
    }
    assert feats["observation.state"]["shape"] == [4]  # nested key named with '.'
    assert feats["next.reward"] == {"dtype": "float32", "shape": [1], "names": None}
    assert feats["next.done"]["dtype"] == "bool"
    assert "rewards" not in feats and "terminated" not in feats
    for name in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert name in feats

    table = pq.read_table(out / "data/chunk-000/file-000.parquet")
    types = {f.name: f.type for f in table.schema}
    assert types[CAM] == pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    assert types["observation.state"] == pa.list_(pa.float32(), 4)
    assert types["next.reward"] == pa.float32() and types["next.done"] == pa.bool_()
    hf = json.loads(table.schema.metadata[b"huggingface"])["info"]["features"]
    assert hf[CAM] == {"_type": "Image"}
    assert hf["observation.state"]["_type"] == "List" and hf["observation.state"]["length"] == 4
    assert pq.ParquetFile(out / "data/chunk-000/file-000.parquet").num_row_groups == 3

    data = read_data(out)
    src = zreplay.open(buf)
    starts = np.concatenate([[0], np.cumsum(LENGTHS)[:-1]])
    for e, (s, n) in enumerate(zip(starts, LENGTHS, strict=True)):
        want = episode(n, e)
        for t in range(n):
            row = s + t
            png = Image.open(io.BytesIO(data[CAM][row]["bytes"]))
            np.testing.assert_array_equal(np.asarray(png), want[CAM][t])
            np.testing.assert_array_equal(
                data["observation.state"][row], want["observation"]["state"][t]
            )
            assert data["next.reward"][row] == want["rewards"][t]
            assert data["next.done"][row] == bool(want["terminated"][t])
            assert data["frame_index"][row] == t and data["episode_index"][row] == e
            assert data["index"][row] == row
            assert data["timestamp"][row] == pytest.approx(t / 10)
    assert src.num_rows == sum(LENGTHS)

    eps = episodes_table(out)
    assert [e["length"] for e in eps] == list(LENGTHS)
    assert [(e["dataset_from_index"], e["dataset_to_index"]) for e in eps] == [
        (0, 5),
        (5, 12),
        (12, 16),
    ]
    assert all(e["tasks"] == ["pick the cube"] for e in eps)
    tasks = pq.read_table(out / "meta/tasks.parquet")
    assert tasks.column("task_index").to_pylist() == [0]
    assert tasks.column("__index_level_0__").to_pylist() == ["pick the cube"]
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["__index_level_0__"]


def test_stats_per_episode_and_overall_are_lerobots(buf, tmp_path):
    out = tmp_path / "ds"
    zreplay.export_lerobot(buf, out, fps=10, images="image")
    eps = episodes_table(out)
    quantiles = {"q01": 0.01, "q10": 0.1, "q50": 0.5, "q90": 0.9, "q99": 0.99}
    for e, n in enumerate(LENGTHS):
        a = episode(n, e)["action"].astype(np.float64)
        row = eps[e]
        np.testing.assert_allclose(row["stats/action/min"], a.min(0))
        np.testing.assert_allclose(row["stats/action/max"], a.max(0))
        np.testing.assert_allclose(row["stats/action/mean"], a.mean(0))
        np.testing.assert_allclose(row["stats/action/std"], a.std(0))
        assert row["stats/action/count"] == [n]
        for q, v in quantiles.items():
            np.testing.assert_allclose(row[f"stats/action/{q}"], np.quantile(a, v, axis=0))
        # Cameras: per channel, (3, 1, 1), in [0, 1].
        assert np.asarray(row[f"stats/{CAM}/mean"]).shape == (3, 1, 1)
        frames = episode(n, e)[CAM].reshape(-1, 3) / 255.0  # all of them: short and small
        np.testing.assert_allclose(np.ravel(row[f"stats/{CAM}/max"]), frames.max(0))
        np.testing.assert_allclose(np.ravel(row[f"stats/{CAM}/min"]), frames.min(0))
        np.testing.assert_allclose(np.ravel(row[f"stats/{CAM}/mean"]), frames.mean(0))
        np.testing.assert_allclose(np.ravel(row[f"stats/{CAM}/std"]), frames.std(0), atol=1e-12)
        for q, v in quantiles.items():
            np.testing.assert_allclose(
                np.ravel(row[f"stats/{CAM}/{q}"]), np.quantile(frames, v, axis=0), atol=1e-12
            )
    stats = json.loads((out / "meta/stats.json").read_text())
    every = np.concatenate([episode(n, e)["action"] for e, n in enumerate(LENGTHS)]).astype(
        np.float64
    )
    np.testing.assert_allclose(stats["action"]["mean"], every.mean(0))
    np.testing.assert_allclose(stats["action"]["std"], every.std(0))
    np.testing.assert_allclose(stats["action"]["min"], every.min(0))
    assert stats["action"]["count"] == [16]
    assert set(stats["action"]) == {"min", "max", "mean", "std", "count", *quantiles}
    assert stats["next.done"]["max"] == [True]
    assert stats["index"]["max"] == [15]


def test_video_export_encodes_each_camera_as_lerobot_does(buf, tmp_path):
    out = tmp_path / "ds"
    zreplay.export_lerobot(buf, out, fps=10, images="video", task=["a", "b", "a"])
    info = json.loads((out / "meta/info.json").read_text())
    assert info["features"][CAM]["dtype"] == "video"
    assert info["features"][CAM]["info"]["video.codec"] == "av1"
    assert info["total_tasks"] == 2
    assert CAM not in pq.read_table(out / "data/chunk-000/file-000.parquet").column_names
    eps = episodes_table(out)
    assert [e["tasks"] for e in eps] == [["a"], ["b"], ["a"]]
    assert sorted(set(read_data(out)["task_index"])) == [0, 1]
    mp4 = out / f"videos/{CAM}/chunk-000/file-000.mp4"
    with av.open(str(mp4)) as c:
        stream = c.streams.video[0]
        assert stream.codec_context.name in ("libdav1d", "libaom-av1", "av1")
        assert stream.codec_context.pix_fmt == "yuv420p"
        frames = [
            (float(f.pts * f.time_base), f.to_ndarray(format="rgb24")) for f in c.decode(stream)
        ]
    assert len(frames) == sum(LENGTHS)
    want = np.concatenate([episode(n, e)[CAM] for e, n in enumerate(LENGTHS)])
    for ep in eps:
        t0, t1 = ep[f"videos/{CAM}/from_timestamp"], ep[f"videos/{CAM}/to_timestamp"]
        a, b = ep["dataset_from_index"], ep["dataset_to_index"]
        assert (t0, t1) == pytest.approx((a / 10, b / 10))
        assert [i for i, (ts, _) in enumerate(frames) if t0 - 1e-4 <= ts < t1 - 1e-4] == list(
            range(a, b)
        )
    got = np.stack([f for _, f in frames]).astype(np.float64)
    mse = np.mean((got - want) ** 2)
    psnr = 10 * np.log10(255**2 / mse)
    assert psnr > 25, psnr  # AV1 crf 30 is lossy, not broken


def test_files_roll_over_between_episodes_never_inside_one(tmp_path):
    path = tmp_path / "buf"
    rb = zreplay.ReplayBuffer(10_000, path=str(path))
    lengths = [30, 1, 45, 20, 2, 33, 8]
    for i, n in enumerate(lengths):
        rb.write_episode(episode(n, i))
    rb.close()
    out = tmp_path / "ds"
    # ~200 bytes a frame: each file holds an episode or a few, never part of one.
    report = zreplay.export_lerobot(
        path, out, fps=10, images="image", data_file_size_mb=0.005, chunks_size=2
    )
    assert report.data_files >= 3
    eps = episodes_table(out)
    files = sorted((out / "data").glob("chunk-*/file-*.parquet"))
    assert (out / "data/chunk-001").is_dir()  # two files per chunk directory
    held = {}
    for f in files:
        t = pq.read_table(f, columns=["index", "episode_index"]).to_pydict()
        chunk, file = int(f.parent.name[6:]), int(f.stem[5:])
        for ep in set(t["episode_index"]):
            held.setdefault(ep, []).append((chunk, file))
    for e, ep in enumerate(eps):
        assert held[e] == [(ep["data/chunk_index"], ep["data/file_index"])]
    assert [e["length"] for e in eps] == lengths

    vout = tmp_path / "vds"
    report = zreplay.export_lerobot(path, vout, fps=10, video_file_size_mb=0.002)
    assert report.video_files >= 2
    for ep in episodes_table(vout):
        mp4 = vout / (
            f"videos/{CAM}/chunk-{ep[f'videos/{CAM}/chunk_index']:03d}/"
            f"file-{ep[f'videos/{CAM}/file_index']:03d}.mp4"
        )
        with av.open(str(mp4)) as c:
            pts = [float(f.pts * f.time_base) for f in c.decode(video=0)]
        t0, t1 = ep[f"videos/{CAM}/from_timestamp"], ep[f"videos/{CAM}/to_timestamp"]
        assert sum(t0 - 1e-4 <= p < t1 - 1e-4 for p in pts) == ep["length"]


def test_partly_evicted_and_unfinished_episodes(tmp_path):
    path = tmp_path / "buf"
    rb = zreplay.ReplayBuffer(1000, path=str(path))
    rb.write_episode(episode(5, 0))
    rb.write_episode(episode(6, 1, ended=False))
    rb.write_episode(episode(4, 2))
    rb.close()
    kept = zreplay.export_lerobot(path, tmp_path / "a", images="image")
    assert (kept.episodes, kept.skipped_unfinished) == (3, 0)
    skipped = zreplay.export_lerobot(path, tmp_path / "b", images="image", unfinished="skip")
    assert (skipped.episodes, skipped.frames, skipped.skipped_unfinished) == (2, 9, 1)
    assert [e["length"] for e in episodes_table(tmp_path / "b")] == [5, 4]
    # An episode whose first steps were evicted is not whole: never exported.
    t = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(tmp_path / "t"), capacity=8, continue_episodes=True
    )
    torch = pytest.importorskip("torch")
    for k in range(3):  # one lane, an episode of 3 x 4 steps, then one of 4
        dones = torch.zeros(4, 1, dtype=torch.bool)
        dones[-1] = k >= 1
        t.add_trajectories(
            [zreplay.Trajectory(max_episode_length=12, rewards=torch.ones(4, 1), dones=dones)]
        )
    t.close()
    table = zreplay.open(tmp_path / "t").core.episode_table()
    assert table["first_step"][0] > 0  # the first episode lost its start to eviction
    report = zreplay.export_lerobot(tmp_path / "t", tmp_path / "c", images="image")
    assert report.skipped_partial == 1
    assert [e["length"] for e in episodes_table(tmp_path / "c")] == list(table["length"][1:])


def test_refusals_leave_nothing_behind(buf, tmp_path):
    existing = tmp_path / "there"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(DestinationError, match="exists"):
        zreplay.export_lerobot(buf, existing)
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
    with pytest.raises(ValueError, match="images"):
        zreplay.export_lerobot(buf, tmp_path / "x", images="gif")
    with pytest.raises(ValueError, match="fps"):
        zreplay.export_lerobot(buf, tmp_path / "x", fps=0)
    with pytest.raises(SchemaError, match="not in the buffer"):
        zreplay.export_lerobot(buf, tmp_path / "x", keys=["nope"])
    with pytest.raises(ValueError, match="one string per exported episode"):
        zreplay.export_lerobot(buf, tmp_path / "x", task=["a"])
    odd = tmp_path / "odd"
    rb = zreplay.ReplayBuffer(100, path=str(odd))
    rb.write_episode({"cam": np.zeros((3, 33, 48, 3), np.uint8), "x": np.zeros((3, *[1] * 5, 2))})
    rb.close()
    with pytest.raises(SchemaError, match="even"):
        zreplay.export_lerobot(odd, tmp_path / "x", keys=["cam"])
    with pytest.raises(SchemaError, match="'x'"):
        zreplay.export_lerobot(odd, tmp_path / "x", images="image")
    empty = tmp_path / "empty"
    zreplay.ReplayBuffer(100, path=str(empty)).close()
    with pytest.raises(EmptyBufferError, match="no whole episodes"):
        zreplay.export_lerobot(empty, tmp_path / "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buf", "empty", "odd", "there"]


@pytest.mark.parametrize("images", ["image", "video"])
def test_an_interrupted_export_leaves_no_dataset(buf, tmp_path, images):
    calls = []

    def interrupt(k):
        calls.append(k)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        zreplay.export_lerobot(buf, tmp_path / "ds", images=images, progress=interrupt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buf"]
    zreplay.export_lerobot(buf, tmp_path / "ds", images=images)  # and the path is free
    assert json.loads((tmp_path / "ds/meta/info.json").read_text())["total_episodes"] == 3


def test_an_open_buffer_or_view_exports_what_it_shows(buf, tmp_path):
    rb = zreplay.ReplayBuffer(1000, path=str(buf))
    rb.write_episode(episode(3, 9))  # not flushed yet: the export flushes it
    report = zreplay.export_lerobot(rb, tmp_path / "a", images="image")
    rb.close()
    assert report.episodes == 4
    report = zreplay.export_lerobot(zreplay.open(buf), tmp_path / "b", images="image")
    assert report.frames == sum(LENGTHS) + 3


def test_cli_export_format_lerobot(buf, tmp_path):
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "zreplay.cli", "export", str(buf), str(out)]
    opts = ["--format", "lerobot", "--fps", "15", "--images", "image", "--task", "t", "--json"]
    r = subprocess.run([*cmd, *opts, "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert (result["episodes"], result["frames"]) == (3, 16)
    assert json.loads((out / "meta/info.json").read_text())["fps"] == 15
    r = subprocess.run([*cmd, *opts, "-q"], capture_output=True, text=True)
    assert r.returncode == 1 and "exists" in r.stdout + r.stderr


def test_rlinf_lanes_become_episodes_with_terminations_as_next_done(tmp_path):
    torch = pytest.importorskip("torch")
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "t"))
    dones = torch.zeros(6, 2, dtype=torch.bool)
    dones[2, 0] = dones[5, 0] = dones[5, 1] = True  # lane 0: episodes of 3 and 3; lane 1: 6
    rewards = torch.arange(12, dtype=torch.float64).reshape(6, 2)
    obs = torch.arange(12 * 3, dtype=torch.float32).reshape(6, 2, 3)
    task = torch.zeros(6, 2, dtype=torch.int64)  # a key LeRobot's items use for the task string
    terminations = dones.clone()
    terminations[5, 1] = False  # lane 1's episode is cut by time: truncated, not terminated
    cols = {"rewards": rewards, "dones": dones, "terminations": terminations}
    buf.add_trajectories([{**cols, "curr_obs": obs, "task": task}])
    buf.close()
    report = zreplay.export_lerobot(tmp_path / "t", tmp_path / "ds", images="image")
    assert not {"task", "dones", "terminations"} & set(report.features)
    assert report.features["next.reward"]["dtype"] == "float64"  # the buffer's own precision
    eps = episodes_table(tmp_path / "ds")
    assert [e["length"] for e in eps] == [3, 3, 6]  # env-major: lane 0's, then lane 1's
    data = read_data(tmp_path / "ds")
    assert data["next.done"] == [False, False, True] * 2 + [False] * 6  # terminations
    want = np.concatenate([rewards[:, 0].numpy(), rewards[:, 1].numpy()])
    np.testing.assert_array_equal(data["next.reward"], want)
    np.testing.assert_array_equal(
        data["curr_obs"], np.concatenate([obs[:, 0].numpy(), obs[:, 1].numpy()])
    )


def test_episode_metadata_rolls_over_too(buf, tmp_path, monkeypatch):
    from zreplay.compat import lerobot_export

    monkeypatch.setattr(lerobot_export, "EPISODES_PER_FILE", 2)
    out = tmp_path / "ds"
    zreplay.export_lerobot(buf, out, images="image")
    files = sorted((out / "meta/episodes").glob("chunk-*/file-*.parquet"))
    assert [f.relative_to(out / "meta/episodes").as_posix() for f in files] == [
        "chunk-000/file-000.parquet",
        "chunk-000/file-001.parquet",
    ]
    eps = episodes_table(out)
    assert [e["episode_index"] for e in eps] == [0, 1, 2]
    assert [e["meta/episodes/file_index"] for e in eps] == [0, 0, 1]
