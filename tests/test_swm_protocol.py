"""The whole stable-worldmodel 0.1.1 ``ReplayBuffer`` / ``Dataset`` protocol on
``zreplay.ReplayBuffer``: its attributes, its ``Dataset`` methods, its exact error texts,
and an HDF5 dump its own loader reads.

Where stable-worldmodel 0.1.1 is installed (``pip install --no-deps
stable-worldmodel==0.1.1``: its package ``__init__`` needs gymnasium environments, lancedb
and more, so the modules under test are imported from its files with their light
dependencies stubbed), the same calls run against its own ``ReplayBuffer`` and its
``HDF5Dataset`` reads zreplay's dumps; without it those tests skip, saying so, and the
layout tests below still check what its loader needs (read from its source: every root
dataset but ``ep_len``/``ep_offset`` is a per-step column, groups break it).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
import types
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import zreplay


def episode(L: int, base: int = 0) -> dict:
    t = np.arange(L)
    return {
        "pixels": ((base + t) % 251).astype(np.uint8)[:, None, None, None]
        * np.ones((1, 4, 4, 3), np.uint8),
        "action": ((base + t)[:, None] * 10 + np.arange(2)).astype(np.float32),
        "reward": np.full(L, 0.5, np.float32),
        "terminated": t == L - 1,
    }


@pytest.fixture
def rb(tmp_path):
    b = zreplay.ReplayBuffer(100, history_len=2, frameskip=2, path=tmp_path / "rb", seed=0)
    yield b
    b.close()


def message(fn) -> tuple[str, str]:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - compared below
        return type(e).__name__, str(e)
    raise AssertionError("no error raised")


# -- attributes, Dataset methods -----------------------------------------------------


def test_num_steps_span_and_truncated_arguments():
    b = zreplay.ReplayBuffer(10.7, history_len=3.9, frameskip=2)
    assert (b.max_steps, b.history_len, b.num_steps, b.frameskip, b.span) == (10, 3, 3, 2, 6)
    assert type(b.num_steps) is int
    b.close()


def test_load_slice_episode_and_chunk(rb):
    rb.write_episode(episode(10, base=0))
    rb.write_episode(episode(7, base=100))
    s = rb._load_slice(1, 2, 5)
    assert list(s) == ["pixels", "action", "reward", "terminated"]  # first episode's order
    assert s["pixels"].shape == (3, 4, 4, 3) and s["pixels"].dtype == np.uint8
    assert s["action"][:, 0].tolist() == [1020.0, 1030.0, 1040.0]  # every step, no stride
    assert rb._load_slice(0, 4, 4)["reward"].shape == (0,)
    whole = rb.load_episode(1)
    assert whole["action"].shape == (7, 2) and whole["terminated"].tolist() == [False] * 6 + [True]
    chunk = rb.load_chunk(np.array([0, 1]), np.array([0, 2]), np.array([4, 6]))
    assert [c["action"].shape for c in chunk] == [(2, 4), (2, 4)]  # (e - s) // frameskip
    assert chunk[1]["pixels"].shape == (4, 4, 4, 3)  # other columns stay dense
    assert chunk[1]["action"][0].tolist() == [1020.0, 1021.0, 1030.0, 1031.0]


def test_slice_errors_are_stable_worldmodels(rb):
    rb.write_episode(episode(10))
    assert message(lambda: rb._load_slice(-1, 0, 1)) == ("IndexError", "-1")
    assert message(lambda: rb._load_slice(1, 0, 1)) == ("IndexError", "1")
    assert message(lambda: rb._load_slice(0, 0, 999)) == (
        "IndexError",
        "slice [0:999] out of episode of length 10",
    )
    assert message(lambda: rb._load_slice(0, 5, 4))[1] == "slice [5:4] out of episode of length 10"
    assert message(lambda: rb.load_episode(-1)) == ("IndexError", "-1")
    assert message(lambda: rb.load_episode(3)) == (
        "IndexError",
        "index 3 is out of bounds for axis 0 with size 1",
    )
    for fn in (lambda: rb.get_col_data("x"), lambda: rb.get_dim("x"), lambda: rb.get_row_data(0)):
        with pytest.raises(NotImplementedError):
            fn()


def test_default_sampler_is_a_callable_hook_that_draws_as_the_default(tmp_path):
    def make(p):
        b = zreplay.ReplayBuffer(100, path=tmp_path / p, seed=3)
        for i in range(3):
            b.write_episode(episode(8, base=10 * i))
        return b

    a, b = make("a"), make("b")
    assert callable(a.sampler) and len(a.sampler(0, a, 5, 1)) == 5  # 5 draws of a's
    old = b.sampler
    b.sampler = lambda step, buf, n, h: old(step, buf, n, h)  # wrapping the default
    old(0, b, 5, 1)
    assert np.array_equal(a.sample(16)["pixels"], b.sample(16)["pixels"])
    a.close(), b.close()


def test_lengths_column_order_and_repr(rb):
    rb.write_episode({"z": np.zeros(5, np.float32), "a": {"x": np.zeros((5, 2))}})
    assert rb.lengths.dtype == np.int32 and rb.column_names == ["z", "a/x"]
    assert list(rb.sample(2)) == ["z", "a"] and list(rb[0]) == ["z", "a"]
    assert repr(rb).startswith(
        "ReplayBuffer(episodes=1, steps=5/100, history_len=2, frameskip=2, columns=[z, a/x]"
    )
    rb.close()
    again = zreplay.ReplayBuffer(100, path=rb.path)
    assert again.column_names == ["z", "a/x"]  # the order is kept with the buffer
    again.close()


# -- error texts, word for word --------------------------------------------------------

CONSTRUCTOR = [
    ({"max_steps": 0}, "max_steps must be positive, got 0"),
    ({"max_steps": -3}, "max_steps must be positive, got -3"),
    ({"max_steps": 5, "history_len": 0}, "history_len must be positive, got 0"),
    ({"max_steps": 5, "frameskip": -1}, "frameskip must be positive, got -1"),
]


def calls(make):
    """Every error path of stable-worldmodel's buffer as ``(name, call)`` on ``make()``:
    a fresh buffer of ``max_steps=20, history_len=2``."""

    def written():
        b = make()
        b.write_episode({"a": np.zeros((4, 2), np.float32), "r": np.zeros(4, np.float32)})
        b.write_episode({"a": np.zeros((5, 2), np.float32), "r": np.zeros(5, np.float32)})
        return b

    def sampler(fn):
        b = written()
        b.sampler = fn
        return b

    return [
        ("scalar", lambda: make().write_episode({"a": np.zeros(3), "r": 1.0})),
        ("length", lambda: make().write_episode({"a": np.zeros(3), "r": np.zeros(4), "s": 2})),
        ("too long", lambda: make().write_episode({"a": np.zeros(21)})),
        ("missing", lambda: written().write_episode({"a": np.zeros((3, 2), np.float32)})),
        (
            "extra",
            lambda: written().write_episode(
                {"a": np.zeros((3, 2)), "r": np.zeros(3), "x": np.zeros(3)}
            ),
        ),
        (
            "shape",
            lambda: written().write_episode(
                {"a": np.zeros((3, 5), np.float32), "r": np.zeros(3, np.float32)}
            ),
        ),
        ("batch_size", lambda: written().sample(0)),
        ("sample history_len", lambda: written().sample(2, history_len=0)),
        ("no clips", lambda: make().sample(2)),
        ("no long clips", lambda: written().sample(2, history_len=6)),
        ("sampler shape", lambda: sampler(lambda s, b, n, h: np.zeros((n, 1), int)).sample(3)),
        ("sampler range", lambda: sampler(lambda s, b, n, h: np.full(n, 99)).sample(3)),
        ("sampler negative", lambda: sampler(lambda s, b, n, h: np.full(n, -1)).sample(3)),
        ("getitem empty", lambda: make()[0]),
        ("getitem", lambda: written()[-100]),
        ("getitem past", lambda: written()[len(written())]),
        ("slice episode", lambda: written()._load_slice(2, 0, 1)),
        ("slice range", lambda: written()._load_slice(0, 2, 9)),
    ]


EXPECTED = {  # what stable-worldmodel 0.1.1 says (read from its source; checked below)
    "scalar": ("ValueError", "ReplayBuffer.write_episode: column 'r' is scalar; expected a per-step array"),
    "length": ("ValueError", "ReplayBuffer.write_episode: column 'r' has length 4, expected 3"),
    "too long": ("ValueError", "ReplayBuffer.write_episode: episode length 21 exceeds max_steps=20"),
    "missing": ("ValueError", "ReplayBuffer.write_episode: schema mismatch. missing=['r'], extra=[]"),
    "extra": ("ValueError", "ReplayBuffer.write_episode: schema mismatch. missing=[], extra=['x']"),
    "shape": ("ValueError", "ReplayBuffer.write_episode: column 'a' per-step shape (5,) mismatches expected (2,)"),
    "batch_size": ("ValueError", "batch_size must be positive, got 0"),
    "sample history_len": ("ValueError", "history_len must be positive, got 0"),
    "no clips": ("RuntimeError", "ReplayBuffer.sample: no clips of history_len=2 available (num_episodes=0, num_steps_stored=0)"),
    "no long clips": ("RuntimeError", "ReplayBuffer.sample: no clips of history_len=6 available (num_episodes=2, num_steps_stored=9)"),
    "sampler shape": ("ValueError", "ReplayBuffer.sample: sampler returned shape (3, 1), expected (3,)"),
    "sampler range": ("IndexError", "ReplayBuffer: clip index out of range [0, 7)"),
    "sampler negative": ("IndexError", "ReplayBuffer: clip index out of range [0, 7)"),
    "getitem empty": ("IndexError", "ReplayBuffer is empty"),
    "getitem": ("IndexError", "-93"),
    "getitem past": ("IndexError", "7"),
    "slice episode": ("IndexError", "2"),
    "slice range": ("IndexError", "slice [2:9] out of episode of length 4"),
}  # fmt: skip


@pytest.mark.parametrize("kwargs, text", CONSTRUCTOR)
def test_constructor_messages(kwargs, text):
    assert message(lambda: zreplay.ReplayBuffer(**kwargs)) == ("ValueError", text)


def test_every_message_is_stable_worldmodels():
    for name, call in calls(lambda: zreplay.ReplayBuffer(20, history_len=2)):
        kind, text = message(call)
        want_kind, want = EXPECTED[name]
        assert text == want, name
        assert kind in (want_kind, "SchemaError", "EmptyBufferError"), name


def test_dump_messages(rb, tmp_path):
    rb.write_episode(episode(4))
    assert message(lambda: rb.dump(tmp_path / "x", format="lance")) == (
        "ValueError",
        "unknown format 'lance'; available: ['hdf5', 'zarr']",
    )
    assert message(lambda: rb.dump(tmp_path / "x.h5", mode="x")) == (
        "ValueError",
        "write mode must be one of ('append', 'overwrite', 'error'), got 'x'",
    )
    rb.dump(tmp_path / "x.h5")
    assert message(lambda: rb.dump(tmp_path / "x.h5", "hdf5", mode="error")) == (
        "FileExistsError",
        f"HDF5Writer: '{tmp_path / 'x.h5'}' already exists. Pass mode='overwrite' to replace "
        "it or mode='append' to extend it.",
    )


# -- the HDF5 dump -----------------------------------------------------------------------


def test_dump_layout_is_what_stable_worldmodels_loader_needs(rb, tmp_path):
    rb.write_episode({**episode(6), "obs": {"state": np.ones((6, 3), np.float32)}})
    rb.write_episode({**episode(4, 50), "obs": {"state": np.zeros((4, 3), np.float32)}})
    f = tmp_path / "d.h5"
    rb.dump(f, "hdf5")
    with h5py.File(f, "r") as h:
        assert all(isinstance(h[k], h5py.Dataset) for k in h)  # no groups at the root
        assert sorted(h) == sorted(
            ["pixels", "action", "reward", "terminated", "obs.state", "ep_len", "ep_offset"]
        )
        assert h["ep_len"].dtype == np.int32 and h["ep_offset"].dtype == np.int64
        assert h["ep_len"][:].tolist() == [6, 4] and h["ep_offset"][:].tolist() == [0, 6]
        for k in h:
            if k not in ("ep_len", "ep_offset"):
                assert h[k].shape[0] == 10, k  # every other root dataset is per step
        meta = json.loads(h.attrs["zreplay"])
        assert meta["version"] == 2 and "obs/state" in meta["columns"]
    back = list(zreplay.iter_hdf5(f))
    assert back[0]["obs"]["state"].shape == (6, 3) and back[1]["pixels"].dtype == np.uint8
    info = zreplay.load_hdf5(f)
    assert info.lengths.tolist() == [6, 4] and info.episode_table()["terminated"].all()
    info.close()


def test_empty_dump_has_an_empty_episode_table(tmp_path):
    b = zreplay.ReplayBuffer(10)
    b.dump(tmp_path / "e.h5")
    with h5py.File(tmp_path / "e.h5", "r") as h:
        assert h["ep_len"].shape == (0,) and h["ep_offset"].shape == (0,)
    assert list(zreplay.iter_hdf5(tmp_path / "e.h5")) == []
    b.close()


def test_nested_keys_that_would_collide_are_refused(tmp_path):
    b = zreplay.ReplayBuffer(10)
    b.write_episode({"a.b": np.zeros(2), "a": {"b": np.zeros(2)}})
    with pytest.raises(zreplay.SchemaError, match="collide"):
        b.dump(tmp_path / "c.h5")
    assert not (tmp_path / "c.h5").exists()
    b.close()


def write_swm_style(path: Path, episodes: list[dict]) -> None:
    """An HDF5 file laid out as stable-worldmodel's HDF5Writer lays it out (one
    uncompressed step per chunk, ep_len int32, no attributes)."""
    with h5py.File(path, "w") as h:
        first = episodes[0]
        for k, v in first.items():
            h.create_dataset(k, shape=(0, *v.shape[1:]), maxshape=(None, *v.shape[1:]),
                             dtype=v.dtype, chunks=(1, *v.shape[1:]))  # fmt: skip
        h.create_dataset("ep_len", shape=(0,), maxshape=(None,), dtype=np.int32)
        h.create_dataset("ep_offset", shape=(0,), maxshape=(None,), dtype=np.int64)
        ptr = 0
        for ep in episodes:
            n = len(next(iter(ep.values())))
            for k, v in ep.items():
                h[k].resize(ptr + n, axis=0)
                h[k][ptr:] = v
            for k, v in (("ep_len", n), ("ep_offset", ptr)):
                h[k].resize(h[k].shape[0] + 1, axis=0)
                h[k][-1] = v
            ptr += n


def test_reads_and_appends_stable_worldmodel_files(tmp_path):
    f = tmp_path / "swm.h5"
    write_swm_style(f, [episode(5), episode(3, 7)])
    eps = list(zreplay.iter_hdf5(f))
    assert [len(e["reward"]) for e in eps] == [5, 3] and eps[1]["action"][0, 0] == 70.0
    b = zreplay.load_hdf5(f)
    assert b.lengths.tolist() == [5, 3]
    b.dump(f, mode="append")
    assert [len(e["reward"]) for e in zreplay.iter_hdf5(f)] == [5, 3, 5, 3]
    with h5py.File(f, "r") as h:
        assert "zreplay" not in h.attrs and h["ep_offset"][:].tolist() == [0, 5, 8, 13]
    b.close()


def test_reads_version_1_dumps(tmp_path):
    """zreplay's earlier layout: nested keys as groups, ep_terminated/ep_truncated."""
    f = tmp_path / "v1.h5"
    with h5py.File(f, "w") as h:
        h["obs/state"] = np.arange(5, dtype=np.float32)[:, None]
        h["reward"] = np.ones(5, np.float32)
        h["ep_len"] = np.array([3, 2])
        h["ep_offset"] = np.array([0, 3])
        h["ep_terminated"] = np.array([True, False])
        h["ep_truncated"] = np.array([False, True])
        h.attrs["zreplay"] = json.dumps(
            {"format": "hdf5-episodes", "version": 1, "columns": ["obs/state", "reward"]}
        )
    eps = list(zreplay.iter_hdf5(f))
    assert eps[1]["obs"]["state"][:, 0].tolist() == [3.0, 4.0]
    from zreplay.cli import main

    assert main(["info", str(f), "--json"]) == 0


# -- against stable-worldmodel 0.1.1 itself ----------------------------------------------


@pytest.fixture
def swm(monkeypatch):
    """stable-worldmodel 0.1.1's ``data`` modules, run from its installed files."""
    try:
        dist = importlib.metadata.distribution("stable-worldmodel")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(
            "stable-worldmodel is not installed; `pip install --no-deps "
            "stable-worldmodel==0.1.1` runs these tests against its own code"
        )
    if dist.version != "0.1.1":
        pytest.skip(f"stable-worldmodel {dist.version} installed; these tests pin 0.1.1")
    root = Path(dist.locate_file("stable_worldmodel"))
    for name, path in (
        ("stable_worldmodel", root),
        ("stable_worldmodel.data", root / "data"),
        ("stable_worldmodel.data.formats", root / "data" / "formats"),
    ):
        shell = types.ModuleType(name)  # a package without its __init__ (heavy imports)
        shell.__path__ = [str(path)]
        monkeypatch.setitem(sys.modules, name, shell)
    utils = types.ModuleType("stable_worldmodel.data.utils")  # only get_cache_dir is used
    utils.get_cache_dir = lambda *a, **k: pytest.fail("HDF5Dataset(name=...) is not used")
    monkeypatch.setitem(sys.modules, "stable_worldmodel.data.utils", utils)
    try:
        importlib.import_module("hdf5plugin")
    except ImportError:  # extra filters; zreplay's dumps use gzip, which HDF5 has
        monkeypatch.setitem(sys.modules, "hdf5plugin", types.ModuleType("hdf5plugin"))
    for sub in ("dataset", "format", "buffer", "formats.hdf5"):
        monkeypatch.delitem(sys.modules, f"stable_worldmodel.data.{sub}", raising=False)
    mods = types.SimpleNamespace(
        buffer=importlib.import_module("stable_worldmodel.data.buffer"),
        hdf5=importlib.import_module("stable_worldmodel.data.formats.hdf5"),
        dataset=importlib.import_module("stable_worldmodel.data.dataset"),
    )
    yield mods
    for sub in ("dataset", "format", "buffer", "formats.hdf5"):
        sys.modules.pop(f"stable_worldmodel.data.{sub}", None)


def test_the_same_messages_as_stable_worldmodel(swm):
    theirs = calls(lambda: swm.buffer.ReplayBuffer(20, history_len=2))
    ours = calls(lambda: zreplay.ReplayBuffer(20, history_len=2))
    for (name, a), (_, b) in zip(theirs, ours, strict=True):
        assert message(a) == EXPECTED[name], f"stable-worldmodel changed: {name}"
        kind, text = message(b)
        assert text == EXPECTED[name][1], name
    for kwargs, text in CONSTRUCTOR:
        assert message(lambda kw=kwargs: swm.buffer.ReplayBuffer(**kw)) == ("ValueError", text)


def test_the_same_slices_chunks_and_samples_as_stable_worldmodel(swm):
    theirs = swm.buffer.ReplayBuffer(100, history_len=2, frameskip=2)
    ours = zreplay.ReplayBuffer(100, history_len=2, frameskip=2)
    for i, L in enumerate((9, 5, 12)):
        theirs.write_episode(episode(L, 10 * i))
        ours.write_episode(episode(L, 10 * i))
    assert isinstance(theirs, swm.dataset.Dataset)
    assert (ours.num_steps, ours.span) == (theirs.num_steps, theirs.span)
    assert ours.lengths.tolist() == theirs.lengths.tolist()
    assert ours.column_names == theirs.column_names and len(ours) == len(theirs)

    def same(a: dict, b: dict) -> None:
        assert list(a) == list(b)
        for k in a:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k

    same(ours.load_episode(2), theirs.load_episode(2))
    same(ours._load_slice(1, 1, 4), theirs._load_slice(1, 1, 4))
    args = (np.array([0, 2]), np.array([1, 3]), np.array([5, 11]))
    for a, b in zip(ours.load_chunk(*args), theirs.load_chunk(*args), strict=True):
        same(a, b)
    for i in range(len(ours)):
        same(ours[i], theirs[i])
    fixed = lambda step, buf, n, h: np.arange(n) * 3 % buf.num_valid_ends(h)  # noqa: E731
    ours.sampler = theirs.sampler = fixed
    same(ours.sample(5), theirs.sample(5))
    ours.close()


def test_stable_worldmodels_loader_reads_a_dump(swm, tmp_path):
    b = zreplay.ReplayBuffer(100)
    for i, L in enumerate((6, 4)):
        b.write_episode({**episode(L, 20 * i), "obs": {"state": np.full((L, 3), i, np.float32)}})
    b.dump(tmp_path / "d.h5", "hdf5")
    ds = swm.hdf5.HDF5Dataset(path=tmp_path / "d.h5", num_steps=2, frameskip=1)
    assert ds.lengths.tolist() == [6, 4] and len(ds) == 5 + 3
    assert sorted(ds.column_names) == sorted(b.column_names[:4] + ["obs.state"])
    ep = ds.load_episode(1)
    assert torch.equal(ep["obs.state"], torch.ones(4, 3))
    assert ep["pixels"].shape == (4, 3, 4, 4) and ep["pixels"].dtype == torch.uint8  # CHW
    want = b.load_episode(1)["pixels"]
    assert torch.equal(ep["pixels"], torch.from_numpy(want).permute(0, 3, 1, 2))
    clip = ds[0]
    assert clip["action"].shape == (2, 2)

    b.dump(tmp_path / "empty.h5")  # after clear: an empty table, still a dataset
    b.clear()
    b.dump(tmp_path / "empty.h5")
    assert len(swm.hdf5.HDF5Dataset(path=tmp_path / "empty.h5").lengths) == 0

    theirs = swm.buffer.ReplayBuffer(100)  # and zreplay reads stable-worldmodel's dumps
    theirs.write_episode(episode(5))
    theirs.dump(tmp_path / "swm.h5", "hdf5")
    back = zreplay.load_hdf5(tmp_path / "swm.h5")
    assert np.array_equal(back.load_episode(0)["pixels"], episode(5)["pixels"])
    back.close(), b.close()
