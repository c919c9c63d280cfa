"""Bad input: a specific ValueError naming the problem, raised before anything is written."""

from __future__ import annotations

import hashlib
import os
import re
from contextlib import closing

import builders
import numpy as np
import pytest
import torch
from conftest import check_rows, make_traj, tree_state
from test_all_or_nothing import _as_dict, assert_exactly
from test_all_or_nothing import persistent as unwindowed

import zreplay
from zreplay import (
    CapacityError,
    EmptyTrajectoryError,
    KeyNameError,
    SchemaError,
)
from zreplay.store.commit import read_commit


def tree_digest(root) -> str:
    """Names and contents of every file under ``root``, except the lock and the commit
    record (flush() republishes the latter with the same rows and a fresh sampler state)."""
    h = hashlib.sha256()
    for r, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for f in sorted(files):
            if f in ("writer.lock", "commit.json"):
                continue
            p = os.path.join(r, f)
            h.update(p.encode())
            with open(p, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


@pytest.fixture
def filled(bufpath):
    buf = zreplay.TrajectoryReplayBuffer(seed=1, auto_save=True, auto_save_path=bufpath)
    buf.add_trajectories([make_traj(0), make_traj(1)])
    buf.flush()
    yield buf
    buf.close()


def _with(key, value, nested_in=None):
    """A good trajectory dict with ``key`` (inside dict ``nested_in``) set to ``value``."""
    d = make_traj(5, as_dict=True)
    if nested_in:
        d[nested_in] = {**d[nested_in], key: value}
    else:
        d[key] = value
    return d


BAD = {
    "wrong dtype": (
        _with("actions", torch.zeros(6, 3, 6, dtype=torch.float64)),
        SchemaError,
        "actions",
    ),
    "wrong row shape": (
        _with("actions", torch.zeros(6, 3, 7)),
        SchemaError,
        "expected float32 [6, 3, 6]",
    ),
    "wrong image dtype": (
        _with("main_images", torch.zeros(6, 3, 8, 8, 3), "curr_obs"),
        SchemaError,
        "curr_obs/main_images",
    ),
    "inconsistent B": (_with("rewards", torch.zeros(6, 2, 2)), SchemaError, "rewards"),
    "inconsistent T": (
        _with("states", torch.zeros(5, 3, 4), "curr_obs"),
        SchemaError,
        "curr_obs/states",
    ),
    "missing key": (
        {k: v for k, v in make_traj(5, as_dict=True).items() if k != "rewards"},
        SchemaError,
        "missing keys ['rewards']",
    ),
    "extra key": (
        _with("bonus", torch.zeros(6, 3, 1)),
        SchemaError,
        "unexpected keys ['bonus']",
    ),
    "extra nested key": (
        _with("depth", torch.zeros(6, 3, 1), "curr_obs"),
        SchemaError,
        "curr_obs/depth",
    ),
    "empty T": (
        {
            k: (
                v[:0]
                if isinstance(v, torch.Tensor)
                else {kk: vv[:0] for kk, vv in v.items()}
                if isinstance(v, dict)
                else v
            )
            for k, v in make_traj(5, as_dict=True).items()
        },
        EmptyTrajectoryError,
        "T=0",
    ),
    "empty B": (
        {
            k: (
                v[:, :0]
                if isinstance(v, torch.Tensor)
                else {kk: vv[:, :0] for kk, vv in v.items()}
                if isinstance(v, dict)
                else v
            )
            for k, v in make_traj(5, as_dict=True).items()
        },
        EmptyTrajectoryError,
        "B=0",
    ),
    "slash in key": (_with("a/b", torch.zeros(6, 3), "curr_obs"), KeyNameError, "a/b"),
    "dotdot key": (_with("..", torch.zeros(6, 3)), KeyNameError, "'..'"),
    "empty key": (_with("", torch.zeros(6, 3)), KeyNameError, "''"),
    "absolute key": (_with("/etc", torch.zeros(6, 3)), KeyNameError, "/etc"),
    "control char key": (_with("a\nb", torch.zeros(6, 3)), KeyNameError, "not a safe name"),
    "non-array value": (_with("rewards", [1, 2, 3]), SchemaError, "rewards"),
    "1-d array": (_with("rewards", torch.zeros(6)), SchemaError, "rewards"),
    "bad epoch rows": (
        _with("dones", torch.zeros(11, 3, 2, dtype=torch.bool)),
        SchemaError,
        "dones",
    ),
    "bfloat16": (
        _with("actions", torch.zeros(6, 3, 6, dtype=torch.bfloat16)),
        SchemaError,
        "bfloat16",
    ),
    "long weights id": (
        {**make_traj(5, as_dict=True), "model_weights_id": "x" * 65},
        SchemaError,
        "64 bytes",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_trajectory_rejected_and_nothing_written(filled, case):
    bad, exc, match = BAD[case]
    before = tree_digest(filled.path)
    with pytest.raises(exc, match=re.escape(match)):
        # A good trajectory first in the same call: it must not be added either.
        filled.add_trajectories([make_traj(4), bad])
    assert issubclass(exc, ValueError)
    filled.flush()
    assert len(filled) == 2 and filled.total_samples == 36
    assert tree_digest(filled.path) == before
    commit = read_commit(filled.core.engine.seg_dir)
    assert (commit.n_traj, commit.n_rows) == (2, 36)
    check_rows(filled.sample(64))
    assert filled.add_trajectories([make_traj(2)]) == [2]


UNSAFE_NAMES = [
    "../outside", "../../etc", "/tmp/x", ".hidden", "a\x00b", "ok\n", "c", "zarr.json",
    ".", "..", "...", "", " ", "a b", "a\\b", "C:\\x", "é", "\u202egnp.exe", "-rf", "*", "a" * 129,
    "a" * 5000, "tab\t", "x\r",
]  # fmt: skip


def test_unsafe_names_never_touch_the_filesystem(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep.txt").write_text("keep")
    path = tmp_path / "b"
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path))
    outside, inside = tree_state(tmp_path, skip=path), tree_state(path)
    x = torch.zeros(2, 2, 1)
    for name in UNSAFE_NAMES:
        for traj in ({name: x, "rewards": x}, {"obs": {name: x}, "rewards": x}, {name: {"a": x}}):
            with pytest.raises(KeyNameError):
                buf.add_trajectories([traj])
        with pytest.raises(KeyNameError):  # a writer id names a directory too
            zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), writer_id=name)
    assert buf.schema is None and len(buf) == 0
    buf.close()
    assert tree_state(tmp_path, skip=path) == outside
    # Inside: no file or directory named after any of them (close() commits, that's all).
    assert set(tree_state(path)) - set(inside) == {"segments/default/zreplay/commit.json"}


def _declared(*shape):
    """An array claiming ``shape`` while holding one byte (zero strides): what a crafted
    file or a broadcast view hands over."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape, (0,) * len(shape))


ENORMOUS = {
    "row of 2**30 elements": (_declared(1, 1, 1 << 15, 1 << 15), SchemaError, "more than"),
    "2**40 steps": (_declared(1 << 40, 1), CapacityError, "stages two trajectories in RAM"),
    "2**40 environments": (_declared(1, 1 << 40), CapacityError, "stages two trajectories"),
    "2**20 steps of 1 MiB": (_declared(1 << 20, 1, 1 << 20), CapacityError, "1024.0 GiB"),
    "axis of length 0": (np.zeros((2, 2, 3, 0), np.float32), SchemaError, "hold no data"),
    "complex dtype": (np.zeros((2, 2), complex), SchemaError, "dtype complex128"),
}


def test_first_trajectory_fixes_schema_and_enormous_shapes_refused(bufpath):
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath) as buf:
        before = tree_state(bufpath)
        for name, (arr, exc, says) in ENORMOUS.items():
            with pytest.raises(exc, match=re.escape(says)):
                buf.add_trajectories([{"x": arr}])
            assert buf.schema is None and len(buf) == 0, name
        assert tree_state(bufpath) == before  # refused before anything was written
        buf.add_trajectories([{"x": np.ones((2, 2, 3), np.float32)}])
        assert len(buf) == 1


def test_oversize_trajectory_for_capacity(bufpath):
    with closing(builders.writer(bufpath, capacity=10)) as buf:
        with pytest.raises(CapacityError, match="exceeds the buffer capacity of 10 rows"):
            builders.add_full(buf, [0])  # 18 rows
        assert buf.num_trajectories == 0


def test_unknown_layout_override_rejected(bufpath):
    with (
        closing(builders.writer(bufpath, layout={"nope": {"codec": "zstd"}})) as buf,
        pytest.raises(SchemaError, match="unknown keys"),
    ):
        builders.add_full(buf, [0])


def test_non_buffer_directory_is_not_overwritten(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    with pytest.raises(zreplay.FormatError, match="not a zreplay buffer"):
        builders.writer(d)
    with pytest.raises(zreplay.FormatError):
        builders.writer(d, overwrite=True)
    assert (d / "notes.txt").read_text() == "keep me"


def test_keys_disagreeing_on_t_name_the_odd_key_and_the_right_shape():
    """rewards with T + 1 rows was reported as "key 'actions': expected float32 [9, 4, 7],
    got float32 [8, 4, 7]": the wrong key and the wrong expected shape."""
    buf = zreplay.TrajectoryReplayBuffer()
    bad = {
        "actions": np.zeros((8, 4, 7), np.float32),
        "rewards": np.zeros((9, 4), np.float32),
        "obs": np.zeros((8, 4, 2), np.float32),
    }
    with pytest.raises(SchemaError, match=r"'rewards' \[9, 4\], while the others have \[8, 4\]"):
        buf.add_trajectories([bad])
    two = {"rewards": np.zeros((9, 4), np.float32), "actions": np.zeros((8, 4, 7), np.float32)}
    with pytest.raises(SchemaError, match=r"'rewards' \[9, 4\], 'actions' \[8, 4\]"):
        buf.add_trajectories([two])  # no majority: both are named
    assert len(buf) == 0
    buf.close()


@pytest.mark.parametrize("writer_id", ["c", "zarr.json", "a/b", "", "-x"])
def test_an_unsafe_writer_id_is_named_as_such_before_anything_is_made(tmp_path, writer_id):
    path = tmp_path / "b"
    with pytest.raises(KeyNameError, match=r"writer_id .* is not a safe name") as err:
        builders.writer(path, writer_id=writer_id)
    assert "nest dicts" not in str(err.value)
    assert not path.exists()


def test_an_unsafe_writer_id_never_overwrites_a_buffer(tmp_path, bufpath):
    b = builders.writer(bufpath)
    builders.add_full(b, [0])
    b.close()
    before = tree_state(bufpath)
    with pytest.raises(KeyNameError):
        builders.writer(bufpath, writer_id="c", overwrite=True)
    assert tree_state(bufpath) == before


def _odd_tensors():
    import torch

    base = torch.ones(4, 2, 3)
    out = {
        "meta device": lambda: torch.empty(4, 2, 3, device="meta"),
        "sparse": lambda: base.to_sparse(),
        "quantized": lambda: torch.quantize_per_tensor(base, 0.1, 0, torch.quint8),
        "nested": lambda: torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(2, 3)]),
        "neg bit": lambda: torch.ones(4, 2, 3, dtype=torch.complex64).conj().imag,
        "conj bit": lambda: torch.ones(4, 2, 3, dtype=torch.complex64).conj(),
        "bfloat16": lambda: base.to(torch.bfloat16),
    }
    if hasattr(torch, "float8_e4m3fn"):
        out["float8"] = lambda: base.to(torch.float8_e4m3fn)
    return out


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", sorted(_odd_tensors()))
def test_tensor_kinds_numpy_cannot_view_are_schema_errors(tmp_path, kind):
    """Defect 10: these escaped as NotImplementedError/TypeError/RuntimeError."""
    with unwindowed(tmp_path / "b") as buf:
        bad = _as_dict(0)
        bad["odd"] = _odd_tensors()[kind]()
        with pytest.raises(zreplay.SchemaError, match="'odd'"):
            buf.add_trajectories([bad])
        buf.add_trajectories([make_traj(0)])  # nothing was fixed by the refused one
    assert_exactly(tmp_path / "b", [0])


def test_a_key_path_too_long_for_the_filesystem_is_refused_before_the_schema(tmp_path):
    """Defect 10: it passed the name check, failed in the filesystem after the schema
    was written, and every later add failed."""
    deep: dict = {"leaf": np.ones((6, 3, 1), np.float32)}
    for i in range(40):
        deep = {f"level{i:02d}_" + "x" * 100: deep}
    with unwindowed(tmp_path / "b") as buf:
        with pytest.raises(zreplay.KeyNameError, match="shorten names or nest less"):
            buf.add_trajectories([{**_as_dict(0), "deep": deep}])
        buf.add_trajectories([make_traj(0)])
    assert_exactly(tmp_path / "b", [0])


def test_one_trajectory_not_in_a_list_is_a_clear_error(tmp_path):
    """Defect 10: add_trajectories(dict) said 'cannot add a str'."""
    with unwindowed(tmp_path / "b") as buf:
        for one in (_as_dict(0), make_traj(0)):
            with pytest.raises(zreplay.SchemaError, match=r"wrap it in a list"):
                buf.add_trajectories(one)
        assert len(buf) == 0
