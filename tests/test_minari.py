"""import_minari on Minari's HDF5 layout written here with h5py as Minari 0.5 documents and
writes it (tests/test_minari_judge.py reads datasets made by minari itself): the obs /
next_obs split, nested spaces, JPEG frames, episode order and flags, and the layouts it
refuses, all or nothing."""

from __future__ import annotations

import io
import json

import h5py
import numpy as np
import pytest

import zreplay
from zreplay.errors import DestinationError, FormatError

Image = pytest.importorskip("PIL.Image")

IMAGE = {"type": "Box", "dtype": "uint8", "shape": [32, 40, 3], "low": 0, "high": 255}
STATE = {"type": "Box", "dtype": "float32", "shape": [3], "low": -1.0, "high": 1.0}


def box_space(sp: dict) -> dict:
    """A Box as Minari serializes it (low/high as full nested lists)."""
    full = np.full(sp["shape"], sp["low"]).tolist(), np.full(sp["shape"], sp["high"]).tolist()
    return {**sp, "low": full[0], "high": full[1]}


OBS_SPACE = {"type": "Dict", "subspaces": {"image": box_space(IMAGE), "state": box_space(STATE)}}
ACT_SPACE = {
    "type": "Tuple",
    "subspaces": [
        {"type": "Discrete", "dtype": "int64", "start": 0, "n": 4},
        box_space({"type": "Box", "dtype": "float32", "shape": [2], "low": -1.0, "high": 1.0}),
    ],
}


def jpeg(frame: np.ndarray) -> np.ndarray:
    """Minari's encode_frame."""
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="JPEG")
    return np.frombuffer(buf.getvalue(), np.uint8)


def decoded(data: np.ndarray) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data.tobytes())), np.uint8)


def episode_data(T: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:32, 0:40]
    frames = np.stack(
        [np.stack([x * 6 + t * 9 + seed, y * 7, x + y * 2 + t], -1) % 256 for t in range(T + 1)]
    ).astype(np.uint8)
    return {
        "image": frames,
        "state": rng.uniform(-1, 1, (T + 1, 3)).astype(np.float32),
        "discrete": rng.integers(0, 4, T),
        "cont": rng.uniform(-1, 1, (T, 2)).astype(np.float32),
        "rewards": rng.standard_normal(T),
        "terminations": np.arange(T) == T - 1 if seed % 2 == 0 else np.zeros(T, bool),
        "truncations": np.zeros(T, bool) if seed % 2 == 0 else np.arange(T) == T - 1,
    }


def write_minari(root, lengths, *, vlen=True, meta_extra=None, skip=()) -> dict[int, dict]:
    """A Minari HDF5 dataset at ``root`` (``root/data/...``), as Minari's HDF5Storage
    writes it: episode groups created in id order, JPEG frames as vlen uint8 (Minari's
    choice when their sizes differ) or as equal-length rows (``vlen=False``)."""
    data = root / "data"
    data.mkdir(parents=True)
    meta = {
        "total_episodes": len(lengths),
        "total_steps": int(sum(lengths)),
        "data_format": "hdf5",
        "jpeg_encoding": True,
        "observation_space": json.dumps(OBS_SPACE),
        "action_space": json.dumps(ACT_SPACE),
        "dataset_id": "test/fake-v0",
        **(meta_extra or {}),
    }
    (data / "metadata.json").write_text(json.dumps(meta))
    episodes = {}
    with h5py.File(data / "main_data.hdf5", "w", track_order=True) as f:
        for i, T in enumerate(lengths):
            ep = episode_data(T, i)
            episodes[i] = ep
            g = f.create_group(f"episode_{i}")
            g.attrs.update({"id": i, "total_steps": T})
            obs = g.create_group("observations")
            frames = [jpeg(fr) for fr in ep["image"]]
            if vlen:
                ds = obs.create_dataset("image", (len(frames),), dtype=h5py.vlen_dtype(np.uint8))
                for k, fr in enumerate(frames):
                    ds[k] = fr
            else:  # equal lengths: a 2-D uint8 dataset (trailing bytes after the JPEG's end)
                n = max(len(fr) for fr in frames)
                obs.create_dataset(
                    "image", data=np.stack([np.pad(fr, (0, n - len(fr))) for fr in frames])
                )
            obs.create_dataset("state", data=ep["state"])
            act = g.create_group("actions")
            act.create_dataset("_index_0", data=ep["discrete"])
            act.create_dataset("_index_1", data=ep["cont"])
            for key in ("rewards", "terminations", "truncations"):
                if key not in skip:
                    g.create_dataset(key, data=ep[key])
            g.create_group("infos").create_dataset("success", data=np.zeros(T + 1, bool))
    return episodes


@pytest.mark.parametrize("vlen", [True, False])
def test_minari_episodes_import_with_obs_next_obs_and_frames_decoded(tmp_path, vlen):
    lengths = [5, 3, 7]
    eps = write_minari(tmp_path / "ds", lengths, vlen=vlen)
    report = zreplay.import_minari(tmp_path / "ds", tmp_path / "buf")
    assert (report.episodes, report.steps) == (3, 15)
    view = zreplay.open(tmp_path / "buf")
    table = view.core.episode_table()
    assert list(table["length"]) == lengths
    assert list(table["terminated"]) == [True, False, True]
    assert list(table["truncated"]) == [False, True, False]
    rows = view.core.rows(np.arange(view.num_rows))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for i, (s, T) in enumerate(zip(starts, lengths, strict=True)):
        ep = eps[i]
        frames = np.stack([decoded(jpeg(fr)) for fr in ep["image"]])  # what Minari reads
        got = {k: np.asarray(v)[s : s + T] for k, v in rows.items()}
        np.testing.assert_array_equal(got["observations/image"], frames[:-1])
        np.testing.assert_array_equal(got["next_obs/image"], frames[1:])
        np.testing.assert_array_equal(got["observations/state"], ep["state"][:-1])
        np.testing.assert_array_equal(got["next_obs/state"], ep["state"][1:])
        np.testing.assert_array_equal(got["actions/_index_0"], ep["discrete"])
        np.testing.assert_array_equal(got["actions/_index_1"], ep["cont"])
        np.testing.assert_array_equal(got["rewards"], ep["rewards"])
        np.testing.assert_array_equal(got["terminated"], ep["terminations"])
        np.testing.assert_array_equal(got["truncated"], ep["truncations"])
    assert rows["observations/image"].dtype == np.uint8
    assert "infos" not in " ".join(rows)
    # It opens as a stable-worldmodel buffer too, episode by episode.
    rb = zreplay.ReplayBuffer(100, path=str(tmp_path / "buf"))
    try:
        assert list(rb.lengths) == lengths
        np.testing.assert_array_equal(rb.load_episode(2)["actions"]["_index_1"], eps[2]["cont"])
    finally:
        rb.close()


def test_episodes_in_numeric_order_and_empty_ones_skipped(tmp_path):
    lengths = [2] * 11 + [0]
    eps = write_minari(tmp_path / "ds", lengths)
    report = zreplay.import_minari(tmp_path / "ds" / "data", tmp_path / "buf")  # data dir too
    assert (report.episodes, report.skipped_empty) == (11, 1)
    view = zreplay.open(tmp_path / "buf")
    rewards = np.asarray(view.core.rows(np.arange(view.num_rows))["rewards"])
    np.testing.assert_array_equal(rewards, np.concatenate([eps[i]["rewards"] for i in range(11)]))


def test_layouts_it_does_not_read_are_refused_and_nothing_is_made(tmp_path):
    cases = {
        "arrow": dict(meta_extra={"data_format": "arrow"}),
        "missing dataset": dict(skip=("rewards",)),
        "count": dict(meta_extra={"total_episodes": 5}),
    }
    for name, kw in cases.items():
        src = tmp_path / name
        write_minari(src, [3, 4], **kw)
        with pytest.raises(FormatError) as e:
            zreplay.import_minari(src, tmp_path / "buf")
        assert {"arrow": "'arrow'", "missing dataset": "'rewards'", "count": "5 episodes"}[
            name
        ] in str(e.value)
        assert not (tmp_path / "buf").exists()
    with pytest.raises(FormatError, match="not a Minari dataset"):
        zreplay.import_minari(tmp_path, tmp_path / "buf")
    src = tmp_path / "short"
    write_minari(src, [3])
    with h5py.File(src / "data/main_data.hdf5", "a") as f:
        del f["episode_0/observations/state"]
        f["episode_0/observations/state"] = np.zeros((3, 3), np.float32)  # T rows, not T + 1
    with pytest.raises(FormatError, match="one more"):
        zreplay.import_minari(src, tmp_path / "buf")
    src = tmp_path / "text"
    write_minari(src, [3])
    with h5py.File(src / "data/main_data.hdf5", "a") as f:
        f["episode_0/observations/mission"] = np.array([b"go"] * 4, dtype=h5py.string_dtype())
    with pytest.raises(FormatError, match="text"):
        zreplay.import_minari(src, tmp_path / "buf")
    src = tmp_path / "nomain"
    write_minari(src, [3])
    (src / "data/main_data.hdf5").unlink()
    with pytest.raises(FormatError, match="main_data.hdf5"):
        zreplay.import_minari(src, tmp_path / "buf")
    assert not (tmp_path / "buf").exists()


def test_destination_rules(tmp_path):
    write_minari(tmp_path / "ds", [3, 2])
    other = tmp_path / "other"
    other.mkdir()
    (other / "x").write_text("mine")
    with pytest.raises(DestinationError):
        zreplay.import_minari(tmp_path / "ds", other)
    assert (other / "x").read_text() == "mine"
    zreplay.import_minari(tmp_path / "ds", tmp_path / "buf")
    with pytest.raises(DestinationError, match="overwrite"):
        zreplay.import_minari(tmp_path / "ds", tmp_path / "buf")
    write_minari(tmp_path / "ds2", [4])
    zreplay.import_minari(tmp_path / "ds2", tmp_path / "buf", overwrite=True)
    assert zreplay.open(tmp_path / "buf").num_rows == 4


def test_an_interrupted_import_leaves_nothing(tmp_path):
    write_minari(tmp_path / "ds", [3, 2, 4])
    seen = []

    def interrupt(k):
        seen.append(k)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        zreplay.import_minari(tmp_path / "ds", tmp_path / "buf", progress=interrupt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_cli_import_detects_a_minari_dataset(tmp_path):
    import subprocess
    import sys

    write_minari(tmp_path / "ds", [3, 4])
    cmd = [sys.executable, "-m", "zreplay.cli", "import", str(tmp_path / "ds"), str(tmp_path / "b")]
    r = subprocess.run([*cmd, "--json", "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert (result["kind"], result["episodes"], result["rows"]) == ("minari", 2, 7)
    r = subprocess.run([*cmd, "-q"], capture_output=True, text=True)
    assert r.returncode == 1 and "--overwrite" in r.stdout + r.stderr


def test_links_out_of_the_file_are_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere.h5"
    with h5py.File(elsewhere, "w") as f:
        f["rewards"] = np.ones(3)
    for how in ("external", "soft", "virtual"):
        src = tmp_path / how
        write_minari(src, [3])
        with h5py.File(src / "data/main_data.hdf5", "a") as f:
            del f["episode_0/rewards"]
            if how == "external":
                f["episode_0/rewards"] = h5py.ExternalLink(str(elsewhere), "rewards")
            elif how == "soft":
                f["episode_0/rewards"] = h5py.SoftLink("/episode_0/truncations")
            else:
                layout = h5py.VirtualLayout(shape=(3,), dtype="f8")
                layout[:] = h5py.VirtualSource(str(elsewhere), "rewards", shape=(3,))
                f["episode_0"].create_virtual_dataset("rewards", layout)
        with pytest.raises(FormatError, match="outside the file"):
            zreplay.import_minari(src, tmp_path / "buf")
        assert not (tmp_path / "buf").exists()
