"""The LeRobot and Minari interchange under hostile input (issue 35's adversarial pass,
beyond the damaged files test_lerobot_import.py and test_minari.py already try): metadata
numbers are bounded by what the files hold (a length of 10**12, negative timestamps, a
lying total_frames), nothing is written outside the destination whether an import or
export succeeds or fails, and a Minari frame that is not a JPEG is refused."""

from __future__ import annotations

import io
import json

import h5py
import numpy as np
import pytest

import zreplay
from zreplay.errors import DestinationError, FormatError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("av")
Image = pytest.importorskip("PIL.Image")

from lerobot_layout import FRONT, write_dataset  # noqa: E402
from test_minari import write_minari  # noqa: E402

EPISODES = "meta/episodes/chunk-000/file-000.parquet"


def rewrite_episodes(src, **columns) -> None:
    """Replace columns of the v3.0 episodes table (``name=[values per episode]``)."""
    path = src / EPISODES
    table = pq.read_table(path)
    for name, values in columns.items():
        i = table.column_names.index(name)
        table = table.set_column(i, name, pa.array(values, table.schema.field(name).type))
    pq.write_table(table, path)


def set_info(src, **changes) -> None:
    path = src / "meta/info.json"
    info = json.loads(path.read_text())
    info.update(changes)
    path.write_text(json.dumps(info))


def refused(src, dst, match: str) -> None:
    with pytest.raises(FormatError, match=match):
        zreplay.import_lerobot(src, dst)
    assert not dst.exists()
    assert sorted(p.name for p in dst.parent.iterdir()) == ["ds"]  # no staging tree left


def test_an_episode_length_of_10_to_the_12_is_refused_without_allocating_it(tmp_path):
    src = tmp_path / "ds"
    write_dataset(src, lengths=(4, 6, 5), video=False)
    huge = 10**12
    # Consistent metadata (lengths, index ranges, totals) that the data file cannot hold.
    rewrite_episodes(
        src,
        length=[4, huge, 5],
        dataset_from_index=[0, 4, 4 + huge],
        dataset_to_index=[4, 4 + huge, 9 + huge],
    )
    set_info(src, total_frames=9 + huge)
    refused(src, tmp_path / "buf", f"holds 6 rows of episode 1, whose length is {huge}")


def test_a_video_span_with_negative_timestamps_is_refused(tmp_path):
    src = tmp_path / "ds"
    write_dataset(src, lengths=(4, 6))
    rewrite_episodes(
        src,
        **{
            f"videos/{FRONT}/from_timestamp": [-5.0, 0.4],
            f"videos/{FRONT}/to_timestamp": [-4.6, 1.0],
        },
    )
    refused(src, tmp_path / "buf", r"episode 0 has 0 frames .* its length is 4")


def test_a_video_span_that_is_not_a_number_is_refused(tmp_path):
    src = tmp_path / "ds"
    write_dataset(src, lengths=(4, 6))
    rewrite_episodes(src, **{f"videos/{FRONT}/to_timestamp": [float("nan"), 1.0]})
    refused(src, tmp_path / "buf", "spans")


@pytest.mark.parametrize("total", [17, 10**12, 0])
def test_info_total_frames_that_lies_is_refused(tmp_path, total):
    src = tmp_path / "ds"
    write_dataset(src, lengths=(4, 6, 5), video=False)
    set_info(src, total_frames=total)
    refused(src, tmp_path / "buf", f"info.json says {total} frames")


def test_info_total_episodes_that_lies_is_refused(tmp_path):
    src = tmp_path / "ds"
    write_dataset(src, lengths=(4, 6), video=False)
    set_info(src, total_episodes=10**12)
    refused(src, tmp_path / "buf", "episodes metadata lists 2")


def test_nothing_is_written_outside_the_destination(tmp_path):
    """Every file an import or export leaves, successful or not, lies under its
    destination; the source is not changed."""
    src = tmp_path / "ds"
    write_dataset(src, lengths=(4, 6))
    before = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}
    work = tmp_path / "work"
    work.mkdir()
    zreplay.import_lerobot(src, work / "buf")
    zreplay.export_lerobot(work / "buf", work / "out", fps=10, images="image")
    with pytest.raises(DestinationError):
        zreplay.export_lerobot(work / "buf", work / "out", fps=10)
    broken = tmp_path / "broken"
    write_dataset(broken, lengths=(4, 6), short_video={1: 2})
    with pytest.raises(FormatError):
        zreplay.import_lerobot(broken, work / "never")
    assert sorted(p.name for p in work.iterdir()) == ["buf", "out"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "ds", "work"]
    assert {p: p.read_bytes() for p in src.rglob("*") if p.is_file()} == before


def test_an_export_target_that_exists_is_refused_and_left_as_it_was(tmp_path):
    src = tmp_path / "ds"
    write_dataset(src, lengths=(3,), video=False)
    zreplay.import_lerobot(src, tmp_path / "buf")
    target = tmp_path / "there"
    target.mkdir()
    (target / "mine.txt").write_text("keep")
    with pytest.raises(DestinationError, match="exists"):
        zreplay.export_lerobot(tmp_path / "buf", target, images="image")
    assert [p.name for p in target.iterdir()] == ["mine.txt"]
    # An empty directory is a directory that exists all the same.
    (target / "mine.txt").unlink()
    with pytest.raises(DestinationError, match="exists"):
        zreplay.export_lerobot(tmp_path / "buf", target, images="image")


def _png(frame: np.ndarray) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return np.frombuffer(buf.getvalue(), np.uint8)


def _replace_frame(src, data: np.ndarray) -> None:
    with h5py.File(src / "data/main_data.hdf5", "a") as f:
        f["episode_0/observations/image"][1] = data


@pytest.mark.parametrize(
    "bad",
    ["png", "garbage", "empty"],
)
def test_a_minari_frame_that_is_not_a_jpeg_is_refused(tmp_path, bad):
    src = tmp_path / "ds"
    episodes = write_minari(src, [3, 2])
    frame = episodes[0]["image"][1]
    data = {
        "png": _png(frame),  # Pillow would read it; Minari writes JPEG only
        "garbage": np.frombuffer(b"\xff\xd8 not really a jpeg", np.uint8),
        "empty": np.zeros(0, np.uint8),
    }[bad]
    _replace_frame(src, data)
    with pytest.raises(FormatError, match="episode_0/observations/image: frame 1 is not a"):
        zreplay.import_minari(src, tmp_path / "buf")
    assert not (tmp_path / "buf").exists()


def test_a_minari_jpeg_of_another_size_than_its_space_is_refused(tmp_path):
    src = tmp_path / "ds"
    write_minari(src, [3])
    buf = io.BytesIO()
    Image.fromarray(np.zeros((64, 80, 3), np.uint8)).save(buf, format="JPEG")
    _replace_frame(src, np.frombuffer(buf.getvalue(), np.uint8))
    with pytest.raises(FormatError, match="frame 1 is 64x80; the observation space declares"):
        zreplay.import_minari(src, tmp_path / "buf")
    assert not (tmp_path / "buf").exists()


def set_feature(src, name: str, **changes) -> None:
    path = src / "meta/info.json"
    info = json.loads(path.read_text())
    info["features"][name].update(changes)
    path.write_text(json.dumps(info))


@pytest.mark.parametrize("dtype", ["int64", "bool", "float16", "uint8"])
def test_a_dtype_info_json_lies_about_is_refused_not_cast(tmp_path, dtype):
    """float32 values declared another dtype were cast (101.1 -> 101, True, 101.125)."""
    src = tmp_path / "ds"
    write_dataset(src, lengths=(4, 5), video=False, image=False)
    set_feature(src, "observation.state", dtype=dtype)
    refused(src, tmp_path / "buf", "'observation.state' holds .* float32 values")


def test_a_huge_video_frame_shape_is_refused_before_allocating_it(tmp_path):
    src = tmp_path / "ds"
    write_dataset(src, lengths=(4, 5), image=False)
    set_feature(src, "observation.images.front", shape=[100000, 100000, 3])
    refused(src, tmp_path / "buf", "info.json declares \\[100000, 100000, 3\\]")
