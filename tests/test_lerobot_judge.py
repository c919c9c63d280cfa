"""``import_lerobot`` judged by LeRobot's own code (0.4.4, in its judge venv; see
tests/lerobot_judge.py): datasets written by LeRobot's writer with real photos and Atari
screens (ale-py), two video cameras (AV1) and an image camera, files rolling over, are
imported equal to what
``LeRobotDataset(...)[i]`` returns item by item; a v2.1 layout imports equal to its
conversion by LeRobot's own v2.1-to-v3.0 converter."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zarr

import zreplay

pytest.importorskip("av")
pytest.importorskip("pyarrow")

from lerobot_judge import JUDGES, needs_judge, run_judge, run_judge_module  # noqa: E402
from lerobot_layout import write_dataset  # noqa: E402

RENAMED = {"next.reward": "rewards", "next.done": "terminated"}
CONVERTER = "lerobot.datasets.v30.convert_dataset_v21_to_v30"


def all_rows(path) -> dict[str, np.ndarray]:
    view = zreplay.open(path)
    return view.rows(np.arange(view.num_rows))


def assert_same_import(a, b) -> None:
    ra, rb = all_rows(a), all_rows(b)
    assert sorted(ra) == sorted(rb)
    for k in ra:
        assert ra[k].dtype == rb[k].dtype, k
        np.testing.assert_array_equal(ra[k], rb[k], err_msg=k)
    ea, eb = zreplay.open(a).episodes(), zreplay.open(b).episodes()
    for field in ("length", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(ea, field), getattr(eb, field), err_msg=field)


@pytest.fixture(scope="module")
def lerobot_v30(tmp_path_factory):
    """A v3.0 dataset by LeRobot's writer (files roll over) and LeRobot's reading of it."""
    scratch = tmp_path_factory.mktemp("judge")
    root, items = scratch / "ds", scratch / "items.npz"
    run_judge("make_lerobot_dataset.py", root, "--episodes", 8, "--data-mb", 0.05, scratch=scratch)
    run_judge("read_lerobot.py", root, items, scratch=scratch)
    return scratch, root, dict(np.load(items))


def test_a_v21_layout_written_from_v30_imports_the_same_rows(tmp_path):
    """Quick: the judges' v2.1 writer (pyarrow + PyAV only) run here on a hand-written v3.0
    layout; its rows import equal, its re-encoded frames close and in the same shape."""
    src, v21 = tmp_path / "v30", tmp_path / "v21"
    write_dataset(src, lengths=(4, 6, 5), data_files=[[0, 1], [2]], video_files=[[0], [1, 2]])
    proc = subprocess.run(
        [sys.executable, str(JUDGES / "write_v21.py"), str(src), str(v21), "mpeg4"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    zreplay.import_lerobot(src, tmp_path / "a")
    zreplay.import_lerobot(v21, tmp_path / "b")
    ra, rb = all_rows(tmp_path / "a"), all_rows(tmp_path / "b")
    front = "observation.images.front"
    for k in ra:
        if k != front:
            np.testing.assert_array_equal(ra[k], rb[k], err_msg=k)
    assert ra[front].shape == rb[front].shape
    assert np.abs(ra[front].astype(int) - rb[front].astype(int)).mean() < 20  # encoded again: lossy


@needs_judge
def test_import_equals_lerobots_reader_item_by_item(lerobot_v30, tmp_path):
    _, root, items = lerobot_v30
    report = zreplay.import_lerobot(root, tmp_path / "buf")
    rows = all_rows(tmp_path / "buf")
    n = len(items["index"])
    assert report.frames == n and report.episodes == 8
    atari = items["observation.images.atari"]
    assert atari.shape == (n, 210, 160, 3) and len(np.unique(atari)) > 4  # a real game screen
    for name, want in items.items():
        if name.startswith("__"):
            continue
        got = rows[RENAMED.get(name, name)]
        assert got.dtype == want.dtype, name
        # Frames exactly (both decode with PyAV); everything else exactly.
        np.testing.assert_array_equal(got.reshape(want.shape), want, err_msg=name)
    eps = zreplay.open(tmp_path / "buf").episodes()
    np.testing.assert_array_equal(eps.length, items["__episode_lengths__"])
    done = items["next.done"].reshape(-1)[np.cumsum(eps.length) - 1]
    np.testing.assert_array_equal(eps.terminated, done)
    np.testing.assert_array_equal(eps.truncated, ~done)
    tasks = json.loads(str(items["__tasks__"]))
    assert report.tasks == tasks
    group = zarr.open_group(str(tmp_path / "buf"), mode="r")["lerobot"].attrs["lerobot"]
    per_episode = [[tasks[i] for i in t] for t in group["episode_tasks"]]
    assert per_episode == json.loads(str(items["__episode_tasks__"]))


@needs_judge
def test_files_rolled_over_so_episodes_share_and_span_files(lerobot_v30):
    """The fixture is what the other tests need it to be: several data and video files,
    some holding more than one episode."""
    _, root, _ = lerobot_v30
    data = sorted(root.glob("data/*/*.parquet"))
    videos = sorted(root.glob("videos/*/*/*.mp4"))
    assert len(data) > 1 and len(videos) > 1
    assert len(data) < 8 or len(videos) < 8  # some file holds several episodes


@needs_judge
def test_v21_imports_the_same_as_lerobots_own_conversion_to_v30(lerobot_v30, tmp_path):
    scratch, root, _ = lerobot_v30
    v21 = tmp_path / "v21"
    run_judge("write_v21.py", root, v21, scratch=scratch)
    parent = tmp_path / "converted"
    parent.mkdir()
    shutil.copytree(v21, parent / "judge")
    # LeRobot 0.4.4's converter: --root is the parent of the dataset directory.
    run_judge_module(
        CONVERTER, "--repo-id", "judge", "--root", parent, "--push-to-hub", "false", scratch=scratch
    )
    assert json.loads((parent / "judge/meta/info.json").read_text())["codebase_version"] == "v3.0"
    a = zreplay.import_lerobot(v21, tmp_path / "from_v21")
    b = zreplay.import_lerobot(parent / "judge", tmp_path / "from_v30")
    assert (a.codebase_version, b.codebase_version) == ("v2.1", "v3.0")
    assert a.tasks == b.tasks and a.frames == b.frames
    assert_same_import(tmp_path / "from_v21", tmp_path / "from_v30")
    # and LeRobot's reader of the converted dataset sees what the v2.1 import holds
    items = tmp_path / "items.npz"
    run_judge("read_lerobot.py", parent / "judge", items, scratch=scratch)
    rows = all_rows(tmp_path / "from_v21")
    for name, want in np.load(items).items():
        if not name.startswith("__"):
            got = rows[RENAMED.get(name, name)]
            np.testing.assert_array_equal(got.reshape(want.shape), want, err_msg=name)
