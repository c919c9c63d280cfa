"""LeRobot round trips in the project's own environment (pyarrow and PyAV, no LeRobot):
a buffer exported in image mode and imported back is the same buffer (rewards and
terminated as scalar rows again, though LeRobot declares them shape (1,)); a dataset
imported and exported again keeps its episodes' tasks."""

from __future__ import annotations

import numpy as np
import pytest

import zreplay

pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("av")

from lerobot_layout import TASKS, write_dataset  # noqa: E402

CAM = "observation.images.front"
LENGTHS = (5, 7, 4)


def episode(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        CAM: rng.integers(0, 256, (n, 8, 10, 3), dtype=np.uint8),
        "observation": {"state": rng.standard_normal((n, 4)).astype(np.float32)},
        "action": rng.standard_normal((n, 2)).astype(np.float32),
        "rewards": rng.random(n).astype(np.float32),
        "terminated": np.arange(n) == n - 1,
    }


def all_rows(path) -> dict[str, np.ndarray]:
    view = zreplay.open(path)
    return view.rows(np.arange(view.num_rows))


def test_exported_in_image_mode_then_imported_is_the_same_buffer(tmp_path):
    rb = zreplay.ReplayBuffer(1000, path=str(tmp_path / "buf"))
    eps = [episode(n, i) for i, n in enumerate(LENGTHS)]
    for ep in eps:
        rb.write_episode(ep)
    rb.close()
    report = zreplay.export_lerobot(tmp_path / "buf", tmp_path / "ds", fps=10, images="image")
    assert report.features["next.reward"]["shape"] == [1]  # what LeRobot writes
    assert report.features["next.done"]["shape"] == [1]
    zreplay.import_lerobot(tmp_path / "ds", tmp_path / "back")

    rows = all_rows(tmp_path / "back")
    # Scalar rows again: rewards [N] float32, terminated [N] bool.
    assert rows["rewards"].shape == (sum(LENGTHS),) and rows["rewards"].dtype == np.float32
    assert rows["terminated"].shape == (sum(LENGTHS),) and rows["terminated"].dtype == bool
    want = {
        CAM: np.concatenate([e[CAM] for e in eps]),
        "observation.state": np.concatenate([e["observation"]["state"] for e in eps]),
        "action": np.concatenate([e["action"] for e in eps]),
        "rewards": np.concatenate([e["rewards"] for e in eps]),
        "terminated": np.concatenate([e["terminated"] for e in eps]),
    }
    for key, value in want.items():
        assert rows[key].shape == value.shape, key
        np.testing.assert_array_equal(rows[key], value, err_msg=key)
    a, b = zreplay.open(tmp_path / "buf").episodes(), zreplay.open(tmp_path / "back").episodes()
    for field in ("length", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


def test_an_imported_datasets_tasks_are_exported_back_when_no_task_is_given(tmp_path):
    write_dataset(tmp_path / "src", lengths=(4, 6, 5))  # episode tasks: pick, place, pick
    zreplay.import_lerobot(tmp_path / "src", tmp_path / "buf")
    zreplay.export_lerobot(tmp_path / "buf", tmp_path / "again", fps=10, images="image")
    episodes = pq.read_table(tmp_path / "again/meta/episodes/chunk-000/file-000.parquet")
    assert episodes.column("tasks").to_pylist() == [[TASKS[0]], [TASKS[1]], [TASKS[0]]]
    tasks = pq.read_table(tmp_path / "again/meta/tasks.parquet")
    assert tasks.column("__index_level_0__").to_pylist() == TASKS
    # An explicit task still wins.
    zreplay.export_lerobot(tmp_path / "buf", tmp_path / "third", fps=10, images="image", task="x")
    episodes = pq.read_table(tmp_path / "third/meta/episodes/chunk-000/file-000.parquet")
    assert episodes.column("tasks").to_pylist() == [["x"]] * 3


def test_episodes_added_after_an_import_export_with_an_empty_task(tmp_path):
    write_dataset(tmp_path / "src", lengths=(4, 6))
    zreplay.import_lerobot(tmp_path / "src", tmp_path / "buf")
    rb = zreplay.ReplayBuffer(1000, path=str(tmp_path / "buf"))
    first = all_rows(tmp_path / "buf")
    rb.write_episode({k: v[:3] for k, v in first.items()})
    rb.close()
    zreplay.export_lerobot(tmp_path / "buf", tmp_path / "ds", fps=10, images="image")
    episodes = pq.read_table(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet")
    assert episodes.column("tasks").to_pylist() == [[TASKS[0]], [TASKS[1]], [""]]
