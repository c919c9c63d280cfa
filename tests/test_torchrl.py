"""``zreplay.torchrl.ZarrStorage`` against TorchRL 0.14.1's own ``LazyTensorStorage``: the
same extends give the same contents, indices, cursors and samples (same seed), wrap-around
and oversized extends included; persistence, checkpoints both ways, schema errors."""

from __future__ import annotations

import json
import logging
import random

import numpy as np
import pytest
import torch
from conftest import tree_state

torchrl = pytest.importorskip("torchrl")

from tensordict import TensorDict  # noqa: E402
from torchrl._utils import logger as torchrl_logger  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers import (  # noqa: E402
    RandomSampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)

import zreplay  # noqa: E402
from zreplay.errors import AppendOnlyError, SchemaError  # noqa: E402
from zreplay.torchrl import ZarrStorage  # noqa: E402

torchrl_logger.setLevel(logging.WARNING)

SAMPLERS = {
    "random": lambda: RandomSampler(),
    "without_replacement": lambda: SamplerWithoutReplacement(),
    "slice_traj_key": lambda: SliceSampler(slice_len=3, traj_key="episode"),
    "slice_end_key_cached": lambda: SliceSampler(
        slice_len=3, end_key=("next", "done"), cache_values=True
    ),
    "slice_auto_key": lambda: SliceSampler(slice_len=3),
    "slice_without_replacement": lambda: SliceSamplerWithoutReplacement(
        slice_len=3, traj_key="episode"
    ),
}


def batch(start: int, n: int) -> TensorDict:
    """Rows whose every field encodes their global write number ``g``."""
    g = torch.arange(start, start + n)
    return TensorDict(
        {
            "g": g,
            "episode": g // 7,
            "pixels": (g % 251).to(torch.uint8).view(-1, 1, 1, 1).expand(n, 4, 4, 3).clone(),
            ("next", "done"): ((g + 1) % 7 == 0).unsqueeze(-1),
            ("next", "obs"): g.float().unsqueeze(-1).expand(n, 3).clone(),
            ("a", "b", "x"): g.to(torch.int16).view(-1, 1),
        },
        [n],
    )


def same(a, b, what: str) -> None:
    assert set(a.keys(True, True)) == set(b.keys(True, True)), what
    for k in a.keys(True, True):
        x, y = a.get(k), b.get(k)
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), (what, k, x, y)


def zarr_rb(path, M, sampler=None, **kw):
    return TensorDictReplayBuffer(
        storage=ZarrStorage(M, path=path, durable=False),
        sampler=sampler or RandomSampler(),
        batch_size=kw.pop("batch_size", 6),
        **kw,
    )


def same_state(ref, new, what: str) -> None:
    A, B = ref.storage, new.storage
    assert len(A) == len(B) and A._is_full == B._is_full, what
    assert tuple(A.shape) == tuple(B.shape), what
    assert A._last_cursor_index == B._last_cursor_index, what
    assert ref.write_count == new.write_count and ref.writer._cursor == new.writer._cursor, what
    same(A[:], B[:].to_tensordict(), f"{what}: storage[:]")


def sample_both(ref, new, seed: int, what: str) -> None:
    out = []
    for rb in (ref, new):
        torch.manual_seed(seed)
        try:
            out.append((rb.sample(), None))
        except Exception as e:  # noqa: BLE001 - both must fail alike
            out.append((None, f"{type(e).__name__}: {e}"))
    (a, ea), (b, eb) = out
    assert ea == eb, (what, ea, eb)
    if ea is None:
        same(a, b, what)


# -- the differential test -------------------------------------------------------------


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_same_contents_and_samples_as_lazy_tensor_storage(sampler, tmp_path):
    rng = random.Random(sampler)
    for trial in range(4):
        M = rng.choice([10, 16, 23])
        ref = TensorDictReplayBuffer(
            storage=LazyTensorStorage(M), sampler=SAMPLERS[sampler](), batch_size=6
        )
        new = zarr_rb(tmp_path / f"{trial}", M, SAMPLERS[sampler]())
        g = 0
        for step in range(rng.randint(2, 7)):
            n = rng.randint(1, 2 * M + 3)  # wraps, and oversized extends (duplicate slots)
            if rng.random() < 0.2:
                got = [(ref.add(batch(g, 1)[0]), new.add(batch(g, 1)[0]))]
                n = 1
            else:
                got = [(ref.extend(batch(g, n)), new.extend(batch(g, n)))]
            g += n
            for i1, i2 in got:
                assert torch.equal(torch.as_tensor(i1), torch.as_tensor(i2))
            what = f"{sampler} trial {trial} step {step}"
            same_state(ref, new, what)
            assert new.storage.core.num_rows <= M + min(M, 4096) - 1, what  # disk bound
            L = len(ref.storage)
            for idx in (
                torch.randint(-L, L, (5,)),
                torch.randint(0, L, (2, 3)),
                torch.rand(L) < 0.5,
                slice(1, None, 3),
                [0, L - 1],
                -1,
                torch.tensor(L // 2),
            ):
                a, b = ref.storage[idx], new.storage[idx]
                same(a, b if isinstance(b, TensorDict) else b.to_tensordict(), f"{what} [{idx}]")
            for k in range(3):
                sample_both(ref, new, trial * 1000 + step * 10 + k, f"{what} sample {k}")
        new.storage.close()


def test_indexing_errors_match_torch(tmp_path):
    rb = zarr_rb(tmp_path / "b", 10)
    rb.extend(batch(0, 6))
    for bad in (6, -7, torch.tensor([0, 6]), torch.tensor([-7])):
        with pytest.raises(IndexError, match="out of bounds for dimension 0 with size 6"):
            rb.storage[bad]
    with pytest.raises(RuntimeError, match="non-initialized"):
        ZarrStorage(3, path=tmp_path / "c").get(0)


def test_a_plain_replay_buffer_and_dtypes(tmp_path):
    rb = ReplayBuffer(storage=ZarrStorage(8, path=tmp_path / "b"), batch_size=4)
    rb.extend(batch(0, 5))
    got = rb.sample()
    assert got["pixels"].dtype == torch.uint8 and got["next", "done"].dtype == torch.bool
    assert got["a", "b", "x"].dtype == torch.int16 and "index" not in got.keys()


# -- persistence -------------------------------------------------------------------------


def test_reopening_the_path_resumes_rows_and_the_writers_cursor(tmp_path):
    path = tmp_path / "replay"
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    rb = zarr_rb(path, 10, batch_size=4)
    g = 0
    for n in (4, 4, 4, 7):
        ref.extend(batch(g, n))
        rb.extend(batch(g, n))
        g += n
    rb.storage.close()

    again = zarr_rb(path, 10, batch_size=4)
    assert len(again) == 10 and again.writer._cursor == 9 and again.write_count == 19
    assert again.storage._last_cursor_index == ref.storage._last_cursor_index == 8
    same(ref.storage[:], again.storage[:].to_tensordict(), "reopened")
    ref.extend(batch(g, 3))
    again.extend(batch(g, 3))
    same_state(ref, again, "extend after reopening")
    s = again.sample()
    assert s["pixels"].dtype == torch.uint8 and s["next", "done"].dtype == torch.bool
    again.storage.close()
    view = zreplay.open(path)  # the same directory is a zreplay buffer
    assert "next/done" in view.keys() and view.num_rows >= 10

    with pytest.raises(ValueError, match="max_size=10"):
        ZarrStorage(20, path=path)
    ZarrStorage(20, path=path, overwrite=True).close()


def test_not_a_zarr_storage_buffer_is_refused(tmp_path):
    buf = zreplay.ReplayBuffer(max_steps=10, path=tmp_path / "swm")
    buf.write_episode({"obs": np.zeros((3, 2), np.float32)})
    buf.close()
    with pytest.raises(zreplay.FormatError, match="not written by ZarrStorage"):
        ZarrStorage(10, path=tmp_path / "swm")


def test_rb_empty_then_extend(tmp_path):
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(5), batch_size=2)
    rb = zarr_rb(tmp_path / "b", 5, batch_size=2)
    for r in (ref, rb):
        for i in range(7):
            r.add(batch(i, 1)[0])
    same_state(ref, rb, "after 7 adds")
    ref.empty()
    rb.empty()
    assert len(rb) == 0 and rb.writer._cursor == 0
    ref.extend(batch(100, 3))
    rb.extend(batch(100, 3))
    same_state(ref, rb, "after empty + extend")


# -- checkpoints -----------------------------------------------------------------------


def fill(rb, sizes=(4, 4, 4, 7)) -> int:
    g = 0
    for n in sizes:
        rb.extend(batch(g, n))
        g += n
    return g


def test_state_dict_round_trips_and_crosses_with_lazy_tensor_storage(tmp_path):
    for sizes in ((4, 3), (4, 4, 4, 7)):  # not full, full with the cursor mid-ring
        ref = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
        rb = zarr_rb(tmp_path / f"a{len(sizes)}", 10, batch_size=4)
        g = fill(ref, sizes)
        fill(rb, sizes)
        sd = rb.state_dict()
        torch.save(sd, tmp_path / "sd.pt")
        for ours, source in (
            (True, torch.load(tmp_path / "sd.pt", weights_only=False)),
            (False, ref.state_dict()),  # TorchRL's: its storage part has no cursor
        ):
            back = zarr_rb(tmp_path / f"b{len(sizes)}{ours}", 10, batch_size=4)
            back.load_state_dict(source)
            same(ref.storage[:], back.storage[:].to_tensordict(), f"load_state_dict {sizes}")
            if ours:
                same_state(ref, back, f"load_state_dict {sizes}")
            ref2 = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
            ref2.load_state_dict(ref.state_dict())
            for r in (ref2, back):
                r.extend(batch(g, 5))
            same_state(ref2, back, f"extend after loading {sizes}")
            back.storage.close()
        lazy = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
        lazy.load_state_dict(sd)  # ours, read by TorchRL's own storage
        same(ref.storage[:], lazy.storage[:], f"LazyTensorStorage loads ours {sizes}")


def test_dumps_loads_and_torchrl_memmap_checkpoints(tmp_path):
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    rb = zarr_rb(tmp_path / "live", 10, batch_size=4)
    g = fill(ref)
    fill(rb)
    rb.dumps(tmp_path / "ckpt")
    rb.extend(batch(1000, 2))  # after the checkpoint: not in it
    view = zreplay.open(tmp_path / "ckpt" / "storage")
    shown = view.rows(np.arange(view.num_rows))["g"]
    # The ring's rows at the dump: none it had overwritten, none extended after it.
    assert shown.max() == g - 1 and shown.min() >= g - 10

    back = zarr_rb(tmp_path / "back", 10, batch_size=4)
    back.loads(tmp_path / "ckpt")
    same_state(ref, back, "rb.loads of a ZarrStorage checkpoint")  # last cursor included
    lazy = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    fill(lazy)
    lazy.dumps(tmp_path / "lazy_ckpt")
    lazy2 = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    lazy2.loads(tmp_path / "lazy_ckpt")
    assert lazy2.storage._last_cursor_index is None  # what TorchRL itself loses (README)

    mm = TensorDictReplayBuffer(
        storage=LazyMemmapStorage(10, scratch_dir=tmp_path / "scratch"), batch_size=4
    )
    fill(mm)
    mm.dumps(tmp_path / "torchrl_ckpt")
    assert (
        json.loads((tmp_path / "torchrl_ckpt" / "writer" / "metadata.json").read_text())["cursor"]
        == 9
    )
    from_torchrl = zarr_rb(tmp_path / "from_torchrl", 10, batch_size=4)
    from_torchrl.loads(tmp_path / "torchrl_ckpt")
    same_state(ref, from_torchrl, "rb.loads of a LazyMemmapStorage checkpoint")
    for r in (ref, back, from_torchrl):
        r.extend(batch(g, 6))
    same_state(ref, back, "extend after loads")
    same_state(ref, from_torchrl, "extend after loading TorchRL's checkpoint")

    wrong = zarr_rb(tmp_path / "wrong", 20)
    with pytest.raises(ValueError, match="max_size=10"):
        wrong.loads(tmp_path / "ckpt")


# -- schema errors, append-only, pickling ----------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        lambda td: td.set("g", td["g"].double()),  # dtype
        lambda td: td.set("pixels", td["pixels"].float()),  # uint8 -> float
        lambda td: td.set(("next", "done"), td["next", "done"].long()),  # bool -> int
        lambda td: td.set(("next", "obs"), td["next", "obs"][:, :1].clone()),  # broadcastable
        lambda td: td.set(("next", "obs"), torch.zeros(len(td), 5)),  # shape
        lambda td: td.exclude(("next", "done")),  # missing key
        lambda td: td.set("extra", torch.zeros(len(td))),  # extra key
    ],
)
def test_schema_errors_write_nothing_and_roll_the_writer_back(change, tmp_path):
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    rb = zarr_rb(tmp_path / "b", 10, batch_size=4)
    ref.extend(batch(0, 6))
    rb.extend(batch(0, 6))
    rb.storage.flush()
    before = tree_state(tmp_path / "b")
    revision = rb.storage._mutation_revision
    with pytest.raises(SchemaError, match="ZarrStorage") as err:
        rb.extend(change(batch(6, 3)))
    assert isinstance(err.value, ValueError)
    assert tree_state(tmp_path / "b") == before
    assert rb.storage._mutation_revision == revision
    assert len(rb) == 6 and rb.writer._cursor == 6 and rb.write_count == 6
    ref.extend(batch(6, 3))
    rb.extend(batch(6, 3))
    same_state(ref, rb, "a good extend after a refused one")


def test_a_bad_first_extend_leaves_the_storage_empty(tmp_path):
    rb = zarr_rb(tmp_path / "b", 10)
    with pytest.raises(SchemaError):
        rb.extend(TensorDict({"x" * 100 + " bad": torch.zeros(3)}, [3]))  # too long escaped
    assert len(rb) == 0 and rb.writer._cursor == 0 and not rb.storage.initialized
    rb.extend(batch(0, 3))
    assert rb.storage[:]["g"].tolist() == [0, 1, 2]


def test_append_only(tmp_path):
    rb = zarr_rb(tmp_path / "b", 10)
    rb.extend(batch(0, 4))
    with pytest.raises(AppendOnlyError):
        rb.storage[0] = batch(9, 1)[0]
    view = rb.storage[:]
    with pytest.raises(RuntimeError, match="append-only"):
        view.set_("g", torch.zeros(4, dtype=torch.int64))
    assert rb.storage[:]["g"].tolist() == [0, 1, 2, 3]


def test_torchrls_prioritized_samplers_do_not_load_with_this_torch():
    """The README says TorchRL's prioritized samplers fail here (its C++ extension does
    not load with torch 2.13): when that changes, this fails and the README must too."""
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler

    with pytest.raises(RuntimeError, match="SumSegmentTreeFp32 is not available"):
        PrioritizedSampler(100, alpha=0.7, beta=0.5)


def test_import_zreplay_does_not_import_torchrl():
    import subprocess
    import sys

    code = "import sys, zreplay; assert 'torchrl' not in sys.modules, 'imported'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_a_slice_sample_reads_images_once(tmp_path):
    """SliceSampler looks at flags through storage[index] before the buffer gathers the
    batch: the storage reads the images of a batch once, not twice."""
    rb = zarr_rb(tmp_path / "b", 50, SliceSampler(slice_len=4, traj_key="episode"), batch_size=8)
    rb.extend(batch(0, 50))
    reads = []
    rows = rb.storage.core.read_global_rows

    def spy(positions, keys=None):
        reads.append(keys)
        return rows(positions, keys)

    rb.storage.core.read_global_rows = spy
    rb.sample()
    assert sum(keys is None or "pixels" in keys for keys in reads) == 1


@pytest.mark.parametrize("how", ["never extended", "emptied"])
def test_a_dump_of_an_empty_storage_loads(tmp_path, how):
    """rb.dumps() of a storage with no rows could not be loaded ('is not a ZarrStorage
    checkpoint'): a run that crashed before its next checkpoint could not resume."""
    rb = zarr_rb(tmp_path / "a", 10)
    if how == "emptied":
        rb.extend(batch(0, 4))
        rb.empty()
    rb.dumps(tmp_path / "ck")
    back = zarr_rb(tmp_path / "b", 10)
    back.extend(batch(100, 3))
    back.loads(tmp_path / "ck")
    assert len(back) == 0
    back.extend(batch(200, 2))
    assert back.storage[:]["g"].tolist() == [200, 201]
    rb.storage.close(), back.storage.close()


def _torchrl_full_ring(M: int = 8, n: int = 11):
    """A TorchRL buffer whose ring wrapped: next slot 3, slot 2 the newest row."""
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(M), batch_size=4)
    ref.extend(batch(0, n))
    assert ref.writer._cursor == n % M
    return ref


def test_a_guessed_next_slot_never_escapes_a_reopen(tmp_path):
    """TorchRL's state dict of a full ring has no cursor (its writer's state has it).
    Closing the storage before the first extend and reopening the path synced the new
    writer to the guess, and the next extend overwrote a recent row, not the oldest."""
    ref = _torchrl_full_ring()
    rb = zarr_rb(tmp_path / "a", 8)
    rb.load_state_dict(ref.state_dict())  # the storage's guess, then the writer's cursor
    rb.storage.close()
    again = zarr_rb(tmp_path / "a", 8)
    for r in (ref, again):
        r.extend(batch(100, 2))
    same(ref.storage[:], again.storage[:].to_tensordict(), "extend after reopening")
    assert again.writer._cursor == ref.writer._cursor
    again.storage.close()


def test_a_guessed_next_slot_is_not_exported_as_known(tmp_path):
    ref = _torchrl_full_ring()
    rb = zarr_rb(tmp_path / "a", 8)
    rb.storage.load_state_dict(ref.storage.state_dict())  # no writer: only a guess
    assert "_next_slot" not in rb.storage.state_dict()
    rb.load_state_dict(ref.state_dict())  # now the writer says where it is
    assert rb.storage.state_dict()["_next_slot"] == 3
    rb.storage.close()


def test_a_view_of_zarr_storage_cuts_episodes_at_next_done(tmp_path):
    """TorchRL marks an episode's end with ("next", "done"); one extend holding eight
    episodes must read as eight episodes, so clips and n-step windows never cross one."""
    n = 400
    td = TensorDict(
        {
            "episode": torch.arange(n) // 50,
            "t": torch.arange(n),
            "pixels": torch.zeros(n, 4, dtype=torch.uint8),
            ("next", "reward"): torch.ones(n, 1),
            ("next", "done"): (torch.arange(n) % 50 == 49).unsqueeze(-1),
        },
        batch_size=[n],
    )
    storage = ZarrStorage(10_000, path=str(tmp_path / "replay"))
    TensorDictReplayBuffer(storage=storage, batch_size=8).extend(td)
    storage.close()
    view = zreplay.open(tmp_path / "replay", seed=0)
    assert view.num_episodes == 8
    clips = view.sample_clips(1000, history_len=8)
    assert (clips["episode"].min(1) == clips["episode"].max(1)).all()
    ns = view.sample_nstep(1000, n=5, gamma=1.0, reward_key="next/reward", obs_key="pixels")
    late = ns["t"] % 50 > 45  # fewer than five steps left in its episode
    assert late.any() and (ns["n_steps"][late] < 5).all()


def test_an_episode_of_zarr_storage_goes_on_across_extends(tmp_path):
    storage = ZarrStorage(1000, path=str(tmp_path / "replay"))
    rb = TensorDictReplayBuffer(storage=storage, batch_size=8)
    for lo, hi in ((0, 30), (30, 50), (50, 60)):  # one episode of 50 steps, then 10 more
        t = torch.arange(lo, hi)
        rb.extend(
            TensorDict({"t": t, ("next", "done"): (t == 49).unsqueeze(-1)}, batch_size=[hi - lo])
        )
    storage.close()
    table = zreplay.open(tmp_path / "replay").episode_table()
    assert table["length"].tolist() == [50, 10]


def _written(c: int, start: int, n: int, lanes: int | None) -> TensorDict:
    """Rows of collector ``c`` whose ``g`` is their write number in its ring (``lanes``:
    that many environments, for ``ndim=2``)."""
    g = torch.arange(start, start + n)
    if lanes is None:
        return TensorDict({"g": g, "collector": torch.full((n,), c)}, [n])
    return TensorDict(  # [envs, time]: the ring runs along time
        {"g": g.expand(lanes, n).clone(), "collector": torch.full((lanes, n), c)},
        [lanes, n],
    )


def _no_overwritten_row(view, written: dict[int, int], slots: int) -> None:
    """Nothing ``view`` returns is a row its collector's ring has overwritten."""
    n = view.num_rows
    assert n >= 1
    got = [view.rows(np.arange(n)), view.sample(500), view[0], view[n - 1]]
    got.append(zreplay.ClipDataset(view, history_len=2)[0])
    clips = view.sample_clips(200, history_len=2)
    got.append(clips)
    for out in got:
        g, c = np.asarray(out["g"]), np.asarray(out["collector"])
        for k, total in written.items():
            mine = g[c == k]
            assert mine.size == 0 or mine.min() >= total - slots, (k, total, mine.min())
    rows = got[0]
    for k, total in written.items():  # the newest row of every ring is shown
        assert (np.asarray(rows["g"])[np.asarray(rows["collector"]) == k] == total - 1).any()


@pytest.mark.parametrize(
    "max_size, sizes, lanes",
    [
        (50, [7, 13, 1, 30, 49, 50, 51, 120, 3], None),
        (64, [5, 64, 17, 100, 9, 33], None),
        (5000, [999, 1500, 4096, 700, 2500, 1], None),
        (60, [4, 9, 25, 2, 11], 3),  # ndim=2: 20 slots of 3 environments along time
    ],
)
def test_a_view_never_shows_a_row_the_ring_overwrote(tmp_path, max_size, sizes, lanes):
    """A learner reading collectors' ZarrStorage rings with zreplay.open draws only rows
    the rings still hold (old rows stay on disk until their whole piece is overwritten)."""
    path = tmp_path / "replay"
    ndim = 1 if lanes is None else 2
    slots = max_size if lanes is None else -(-max_size // lanes)
    storages = [
        ZarrStorage(max_size, path=str(path), writer_id=f"collector-{c}", ndim=ndim)
        for c in range(2)
    ]
    rbs = [TensorDictReplayBuffer(storage=s, batch_size=4) for s in storages]
    written = {0: 0, 1: 0}
    for rnd in range(3):
        for c, rb in enumerate(rbs):
            for n in sizes[rnd % 2 :: 1 + c]:
                rb.extend(_written(c, written[c], n, lanes))
                written[c] += n
            rb.storage.flush()
        view = zreplay.open(path, seed=rnd)
        _no_overwritten_row(view, written, slots)
        view.close()
    for s in storages:
        s.close()


@pytest.mark.parametrize("value", ["50", -3, 0, True, 2**70, 1.5])
def test_a_crafted_view_rows_is_refused_and_reported(tmp_path, value):
    """``view_rows`` in a commit record is a stranger's number: a view refuses a bad one
    (CorruptBufferError) and zreplay.verify names it."""
    path = tmp_path / "replay"
    rb = zarr_rb(str(path), 20)
    rb.extend(batch(0, 30))
    rb.storage.close()
    assert zreplay.open(path).num_rows <= 20 and not zreplay.verify(path).problems
    (record,) = path.glob("segments/*/zreplay/commit.json")
    commit = json.loads(record.read_text())
    assert commit["sampler"]["view_rows"] == 20
    commit["sampler"]["view_rows"] = value
    record.write_text(json.dumps(commit))
    with pytest.raises(zreplay.CorruptBufferError, match="view_rows"):
        zreplay.open(path)
    assert any("view_rows" in p for p in zreplay.verify(path).problems)


@pytest.mark.parametrize("collectors", [1, 2])
def test_a_trajectory_buffer_loads_only_the_rings_rows(tmp_path, collectors):
    """RLinf's load_checkpoint of collectors' ZarrStorage path takes what a view of it
    shows: no row a ring overwrote."""
    path = tmp_path / "replay"
    for c in range(collectors):
        s = ZarrStorage(10, path=str(path), writer_id=f"collector-{c}")
        g = fill(TensorDictReplayBuffer(storage=s, batch_size=2))
        s.close()
    dst = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "dst"))
    dst.load_checkpoint(str(path))
    dst.close()
    view = zreplay.open(tmp_path / "dst")
    shown = view.rows(np.arange(view.num_rows))["g"]
    assert shown.min() >= g - 10 and (shown == g - 1).sum() == collectors


@pytest.mark.parametrize("format", ["zarr", "hdf5"])
def test_zreplay_dump_of_a_zarr_storage_holds_only_the_rings_rows(tmp_path, format):
    """zreplay.dump of a ZarrStorage writes what a view of it shows: no row its ring
    overwrote (they stay on disk until their whole piece is overwritten)."""
    storage = ZarrStorage(10, path=str(tmp_path / "replay"))
    g = fill(TensorDictReplayBuffer(storage=storage, batch_size=2))
    out = tmp_path / ("dump.h5" if format == "hdf5" else "dump")
    zreplay.dump(storage, out, format=format)
    storage.close()
    if format == "hdf5":
        h5py = pytest.importorskip("h5py")
        with h5py.File(out) as f:
            shown = f["g"][:]
    else:
        view = zreplay.open(out)
        shown = view.rows(np.arange(view.num_rows))["g"]
    assert shown.min() >= g - 10 and shown.max() == g - 1


@pytest.mark.parametrize("n", [50, 51, 99, 130])
def test_a_view_shows_the_whole_ring_after_an_extend_that_fills_it(tmp_path, n):
    """An extend of at least ``max_size`` rows leaves the ring's rows one piece on disk,
    so a view shows exactly the ring, none of it missing, nothing overwritten."""
    storage = ZarrStorage(50, path=str(tmp_path / "replay"))
    rb = TensorDictReplayBuffer(storage=storage, batch_size=2)
    rb.extend(batch(0, 7))
    rb.extend(batch(7, n))
    storage.flush()
    view = zreplay.open(tmp_path / "replay")
    shown = view.rows(np.arange(view.num_rows))["g"]
    assert sorted(shown.tolist()) == list(range(7 + n - 50, 7 + n))
    storage.close()
