"""import_minari judged by Minari 0.5.4 itself, in LeRobot's judge environment
(tests/lerobot_judge.py, ``ZREPLAY_LEROBOT_PYTHON``): a dataset made by
``minari.create_dataset_from_buffers`` (a Dict observation space with a JPEG-encoded image,
both of Minari's JPEG layouts: equal-size frames as rows, others as vlen) imports equal to
``minari.load_dataset(...).iterate_episodes()`` episode by episode."""

from __future__ import annotations

import json

import numpy as np
import pytest
from lerobot_judge import run_judge_source

import zreplay

pytestmark = pytest.mark.slow

LENGTHS = (6, 3, 9)

# Made by minari's own writer; what minari's own reader gives, saved as "<episode>/<key>".
MAKE = r"""
import json, sys
import numpy as np
import gymnasium as gym
import minari
from minari.data_collector import EpisodeBuffer

out = sys.argv[1]
obs_space = gym.spaces.Dict({
    "pixels": gym.spaces.Box(0, 255, (48, 64, 3), np.uint8),
    "state": gym.spaces.Box(-1, 1, (5,), np.float32),
})
act_space = gym.spaces.Box(-1, 1, (2,), np.float32)
rng = np.random.default_rng(0)
buffers = []
for i, T in enumerate([6, 3, 9]):
    y, x = np.mgrid[0:48, 0:64]
    t = np.arange(T + 1)[:, None, None]
    pix = (np.stack([x * 3 + t * 5 + i * 40, y * 4 + t, (x + y) * 2 + t * 3], -1) % 256).astype(np.uint8)
    buffers.append(EpisodeBuffer(
        id=i,
        observations={"pixels": pix, "state": rng.uniform(-1, 1, (T + 1, 5)).astype(np.float32)},
        actions=rng.uniform(-1, 1, (T, 2)).astype(np.float32),
        rewards=rng.standard_normal(T),
        terminations=np.arange(T) == T - 1 if i != 1 else np.zeros(T, bool),
        truncations=np.zeros(T, bool) if i != 1 else np.arange(T) == T - 1,
    ))
ds = minari.create_dataset_from_buffers(
    "zreplay/judge-v0", buffers, observation_space=obs_space, action_space=act_space,
    algorithm_name="random", author="zreplay", author_email="none@example.com",
    code_permalink="https://example.com", data_format="hdf5",
)
arrays = {}
for ep in minari.load_dataset("zreplay/judge-v0").iterate_episodes():
    e = ep.id
    for k, v in ep.observations.items():
        arrays[f"{e}/observations/{k}"] = v
    arrays[f"{e}/actions"] = ep.actions
    arrays[f"{e}/rewards"] = ep.rewards
    arrays[f"{e}/terminations"] = ep.terminations
    arrays[f"{e}/truncations"] = ep.truncations
np.savez(out, **arrays)
print(json.dumps({"path": str(ds.storage.data_path.parent), "episodes": ds.total_episodes,
                  "jpeg": ds.storage.jpeg_encoding if hasattr(ds.storage, "jpeg_encoding") else None}))
"""


def test_minari_made_dataset_imports_as_minari_reads_it(tmp_path):
    out = tmp_path / "minari_read.npz"
    made = json.loads(run_judge_source(MAKE, out, scratch=tmp_path).splitlines()[-1])
    assert made["episodes"] == len(LENGTHS) and made["jpeg"] is True
    want = np.load(out)
    report = zreplay.import_minari(made["path"], tmp_path / "buf")
    assert (report.episodes, report.steps) == (len(LENGTHS), sum(LENGTHS))
    view = zreplay.open(tmp_path / "buf")
    table = view.core.episode_table()
    assert list(table["length"]) == list(LENGTHS)
    rows = {k: np.asarray(v) for k, v in view.core.rows(np.arange(view.num_rows)).items()}
    starts = np.concatenate([[0], np.cumsum(LENGTHS)[:-1]])
    for e, (s, T) in enumerate(zip(starts, LENGTHS, strict=True)):
        got = {k: v[s : s + T] for k, v in rows.items()}
        for key in ("pixels", "state"):
            obs = want[f"{e}/observations/{key}"]
            assert len(obs) == T + 1
            np.testing.assert_array_equal(got[f"observations/{key}"], obs[:-1])
            np.testing.assert_array_equal(got[f"next_obs/{key}"], obs[1:])
        np.testing.assert_array_equal(got["actions"], want[f"{e}/actions"])
        np.testing.assert_array_equal(got["rewards"], want[f"{e}/rewards"])
        np.testing.assert_array_equal(got["terminated"], want[f"{e}/terminations"])
        np.testing.assert_array_equal(got["truncated"], want[f"{e}/truncations"])
        assert bool(table["terminated"][e]) == bool(want[f"{e}/terminations"][-1])
        assert bool(table["truncated"][e]) == bool(want[f"{e}/truncations"][-1])
