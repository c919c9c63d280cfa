"""``zreplay.import_lerobot`` and ``zreplay import`` on LeRobot layouts written by hand
(tests/lerobot_layout.py: pyarrow + PyAV, no LeRobot): what lands in the buffer, and
damaged or unsupported input refused with nothing written.  LeRobot's own writer and
reader judge the import in tests/test_lerobot_judge.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

import zreplay
from zreplay.cli import main as cli
from zreplay.errors import DestinationError, FormatError, KeyNameError

pytest.importorskip("av")
pytest.importorskip("pyarrow")

from lerobot_layout import FRONT, TASKS, WRIST, decode_mp4, write_dataset  # noqa: E402

RENAMED = {"next.reward": "rewards", "next.done": "terminated"}
SRC = Path(__file__).resolve().parents[1] / "src"


def all_rows(path) -> dict[str, np.ndarray]:
    view = zreplay.open(path)
    return view.rows(np.arange(view.num_rows))


def check_rows(got: dict, expected: dict) -> None:
    for name, want in expected.items():
        key = RENAMED.get(name, name)
        assert got[key].dtype == want.dtype, name
        np.testing.assert_array_equal(got[key].reshape(want.shape), want, err_msg=name)


def test_v30_episodes_rows_frames_and_tasks_arrive_exactly(tmp_path):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    # Episodes share files, and data and video files group them differently.
    expected = write_dataset(
        src, lengths=(5, 7, 6), data_files=[[0, 1], [2]], video_files=[[0], [1, 2]]
    )
    report = zreplay.import_lerobot(src, dst)

    rows = all_rows(dst)
    check_rows(rows, expected)
    # The video, decoded once per file, is what PyAV decodes from each file in order.
    frames = np.concatenate(
        [decode_mp4(src / f"videos/{FRONT}/chunk-000/file-{f:03d}.mp4") for f in (0, 1)]
    )
    np.testing.assert_array_equal(rows[FRONT], frames)
    assert rows[FRONT].shape == (18, 16, 24, 3) and rows[WRIST].dtype == np.uint8
    # Flags: episodes 0 and 2 end done (terminated), episode 1 does not (truncated).
    eps = zreplay.open(dst).episodes()
    assert list(eps.length) == [5, 7, 6]
    assert list(eps.terminated) == [True, False, True]
    assert list(eps.truncated) == [False, True, False]
    assert rows["truncated"].reshape(-1).sum() == 1
    # The task strings, by task_index and per episode, readable with plain zarr.
    meta = zarr.open_group(str(dst), mode="r")["lerobot"].attrs["lerobot"]
    assert meta["tasks"] == TASKS and meta["episode_tasks"] == [[0], [1], [0]]
    assert meta["episode_index"] == [0, 1, 2] and meta["codebase_version"] == "v3.0"
    assert (report.episodes, report.frames, report.tasks) == (3, 18, TASKS)
    assert report.video_frames == 18 and report.features[FRONT] == "video"
    assert report.keys["next.reward"] == "rewards" and "3 episodes, 18 frames" in str(report)
    # Dotted feature names are keys users sample by.
    assert zreplay.open(dst).sample(4)[FRONT].shape == (4, 16, 24, 3)


def test_v21_layout_imports_its_per_episode_files(tmp_path):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    expected = write_dataset(src, "v2.1", lengths=(4, 6))
    report = zreplay.import_lerobot(src, dst)
    rows = all_rows(dst)
    check_rows(rows, expected)
    frames = [decode_mp4(src / f"videos/chunk-000/{FRONT}/episode_{e:06d}.mp4") for e in (0, 1)]
    np.testing.assert_array_equal(rows[FRONT], np.concatenate(frames))
    assert report.codebase_version == "v2.1" and report.tasks == TASKS
    assert list(zreplay.open(dst).episodes().length) == [4, 6]


def test_progress_counts_frames_and_the_buffer_reopens_as_a_replay_buffer(tmp_path):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    write_dataset(src, lengths=(3, 4), video=False)
    seen = []
    zreplay.import_lerobot(src, dst, progress=seen.append)
    assert seen == [3, 4]
    rb = zreplay.ReplayBuffer(100, path=str(dst), history_len=2)
    try:
        assert rb.num_episodes == 2 and rb.sample(3)["action"].shape == (3, 2, 2)
    finally:
        rb.close()


def test_multidimensional_features_keep_their_declared_shape_and_dtype(tmp_path):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    joints = np.arange(9 * 6, dtype=np.float64).reshape(9, 2, 3) / 7
    counts = np.arange(9, dtype=np.int16)[:, None].repeat(4, 1)
    extra = {
        "observation.joints": {"dtype": "float64", "shape": [2, 3], "names": None},
        "observation.counts": {"dtype": "int16", "shape": [4], "names": None},
    }
    cols = {"observation.joints": joints, "observation.counts": counts}
    expected = write_dataset(
        src, lengths=(4, 5), video=False, extra_features=extra, extra_columns=cols
    )
    zreplay.import_lerobot(src, dst)
    rows = all_rows(dst)
    check_rows(rows, expected)
    assert (
        rows["observation.joints"].shape == (9, 2, 3)
        and rows["observation.counts"].dtype == np.int16
    )


def _leaves_nothing(tmp_path, dst) -> None:
    assert not dst.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no staging tree left


def test_a_truncated_parquet_file_fails_naming_it_and_writes_nothing(tmp_path):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    write_dataset(src, lengths=(5, 7, 6), data_files=[[0], [1, 2]])
    part = src / "data/chunk-000/file-001.parquet"
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    with pytest.raises(FormatError, match="file-001.parquet"):
        zreplay.import_lerobot(src, dst)
    _leaves_nothing(tmp_path, dst)


def test_an_mp4_shorter_than_its_episodes_fails_and_writes_nothing(tmp_path):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    write_dataset(src, lengths=(5, 7, 6), short_video={2: 2})
    with pytest.raises(FormatError, match=r"episode 2 has 4 frames .* its length is 6"):
        zreplay.import_lerobot(src, dst)
    _leaves_nothing(tmp_path, dst)


def test_an_episode_split_across_data_files_is_refused(tmp_path):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    write_dataset(src, lengths=(5, 8, 6), data_files=[[0, 1], [2]], split_episode=1)
    with pytest.raises(FormatError, match="holds 4 rows of episode 1, whose length is 8"):
        zreplay.import_lerobot(src, dst)
    _leaves_nothing(tmp_path, dst)


@pytest.mark.parametrize("name", ["../escape", "a/b", "zarr.json", ".hidden"])
def test_feature_names_unsafe_on_disk_are_refused_before_anything_is_written(tmp_path, name):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    extra = {name: {"dtype": "float32", "shape": [1], "names": None}}
    write_dataset(src, lengths=(2,), video=False, extra_features=extra)
    with pytest.raises(KeyNameError, match="not a safe name"):
        zreplay.import_lerobot(src, dst)
    _leaves_nothing(tmp_path, dst)


def test_features_stored_under_one_key_are_refused(tmp_path):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    extra = {"rewards": {"dtype": "float32", "shape": [1], "names": None}}
    write_dataset(src, lengths=(2,), video=False, extra_features=extra)
    with pytest.raises(FormatError, match="'next.reward' and 'rewards' would both be stored"):
        zreplay.import_lerobot(src, dst)
    _leaves_nothing(tmp_path, dst)


def test_a_path_template_leading_out_of_the_dataset_is_refused(tmp_path):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    write_dataset(
        src,
        lengths=(2,),
        video=False,
        info_changes={"data_path": "../x/{chunk_index}-{file_index}.parquet"},
    )
    with pytest.raises(FormatError, match="leads out of"):
        zreplay.import_lerobot(src, dst)
    _leaves_nothing(tmp_path, dst)


def test_depth_maps_and_audio_are_refused_clearly(tmp_path):
    depth = {
        "dtype": "video",
        "shape": [16, 24, 3],
        "names": None,
        "info": {"video.is_depth_map": True},
    }
    audio = {"dtype": "audio", "shape": [1], "names": None}
    for i, (extra, what) in enumerate(
        [({"observation.depth": depth}, "depth map"), ({"mic": audio}, "audio")]
    ):
        src = tmp_path / f"ds{i}"
        write_dataset(src, lengths=(2,), video=False, extra_features=extra)
        with pytest.raises(FormatError, match=what):
            zreplay.import_lerobot(src, tmp_path / f"buf{i}")
        assert not (tmp_path / f"buf{i}").exists()


def test_other_codebase_versions_are_refused_naming_the_version(tmp_path):
    src = tmp_path / "ds"
    write_dataset(src, lengths=(2,), video=False, info_changes={"codebase_version": "v2.0"})
    with pytest.raises(FormatError, match="'v2.0'.*v3.0 and v2.1"):
        zreplay.import_lerobot(src, tmp_path / "buf")


def test_an_existing_destination_is_refused_unless_it_is_a_buffer_and_overwrite(tmp_path):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    write_dataset(src, lengths=(2, 3), video=False)
    dst.mkdir()
    (dst / "notes.txt").write_text("mine")
    with pytest.raises(DestinationError):
        zreplay.import_lerobot(src, dst, overwrite=True)  # not a buffer: never replaced
    assert (dst / "notes.txt").read_text() == "mine"
    other = tmp_path / "other"
    zreplay.import_lerobot(src, other)
    with pytest.raises(DestinationError, match="overwrite=True"):
        zreplay.import_lerobot(src, other)
    write_dataset(tmp_path / "ds2", lengths=(4,), video=False)
    zreplay.import_lerobot(tmp_path / "ds2", other, overwrite=True)
    assert list(zreplay.open(other).episodes().length) == [4]


def test_ctrl_c_during_an_import_leaves_nothing(tmp_path):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    write_dataset(src, lengths=(3, 3, 3), video=False)

    def interrupt(n):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        zreplay.import_lerobot(src, dst, progress=interrupt)
    _leaves_nothing(tmp_path, dst)


def test_a_missing_extra_is_named(tmp_path, monkeypatch):
    src = tmp_path / "ds"
    write_dataset(src, lengths=(2,), video=False)
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(ImportError, match=r"zreplay\[lerobot\]"):
        zreplay.import_lerobot(src, tmp_path / "buf")


def test_cli_import_detects_lerobot_and_prints_the_report(tmp_path, capsys):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    write_dataset(src, "v2.1", lengths=(3, 2))
    assert cli(["import", "--json", str(src), str(dst)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "lerobot" and out["episodes"] == 2 and out["rows"] == 5
    assert out["report"]["codebase_version"] == "v2.1" and out["report"]["tasks"] == TASKS
    assert cli(["import", str(src), str(tmp_path / "buf2")]) == 0
    assert "imported 2 episodes, 5 frames, 2 tasks" in capsys.readouterr().out
    # An unsupported version is named, not mistaken for "not a dataset".
    (src / "meta/info.json").write_text(json.dumps({"codebase_version": "v1.6"}))
    assert cli(["import", str(src), str(tmp_path / "buf3")]) == 1
    assert "'v1.6'" in capsys.readouterr().err


def test_a_killed_import_leaves_nothing_and_the_next_one_succeeds(tmp_path):
    src, dst = tmp_path / "ds", tmp_path / "buf"
    write_dataset(src, lengths=(3, 4, 5), video=False)
    script = (
        "import os, signal, sys, zreplay\n"
        "def die(n):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "zreplay.import_lerobot(sys.argv[1], sys.argv[2], progress=die)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run([sys.executable, "-c", script, str(src), str(dst)], env=env, timeout=300)
    assert proc.returncode == -signal.SIGKILL
    assert not dst.exists()
    zreplay.import_lerobot(src, dst)  # a killed import's staging tree is no obstacle
    assert list(zreplay.open(dst).episodes().length) == [3, 4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buf", "ds"]
