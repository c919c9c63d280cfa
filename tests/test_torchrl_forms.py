"""``ZarrStorage`` holds what TorchRL's tensor storages hold (tensors, pytrees,
tensorclasses, any TensorDict key name) and crosses a process boundary as a read-only
copy; each compared with ``LazyTensorStorage`` under the same seed where TorchRL has an
answer."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import warnings

import pytest
import torch
from conftest import tree_state

torchrl = pytest.importorskip("torchrl")

from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict, tensorclass  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer  # noqa: E402
from torchrl.data.replay_buffers.samplers import SliceSampler  # noqa: E402

import zreplay  # noqa: E402
from zreplay.errors import KeyNameError, ReadOnlyError, SchemaError, StackError  # noqa: E402
from zreplay.torchrl import ZarrStorage  # noqa: E402


@tensorclass
class Step:  # module level: importable by name in another process
    obs: torch.Tensor
    reward: torch.Tensor


@tensorclass
class Outer:  # a tensorclass nesting another, as TorchRL's own tests build them
    obs: torch.Tensor
    next: Step


def tree(n: int, start: int = 0) -> dict:
    g = torch.arange(start, start + n)
    return {
        "a": g[:, None],
        "b": {"c": [g[:, None].float().expand(n, 3).clone(), (g.to(torch.int16)[:, None],)]},
        30: (g % 2 == 0),
    }


def same_tree(x, y, what: str) -> None:
    (lx, sx), (ly, sy) = tree_flatten(x), tree_flatten(y)
    assert sx == sy, what
    for a, b in zip(lx, ly, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), (what, a, b)


DATA = {
    "tensor": lambda n, s: torch.arange(s, s + n).view(n, 1).repeat(1, 2),
    "pytree": tree,
    "tensorclass": lambda n, s: Step(
        obs=torch.arange(s, s + n).float()[:, None], reward=torch.ones(n), batch_size=[n]
    ),
}


def as_tree(x):
    return x._tensordict.to_dict() if isinstance(x, Step) else x


@pytest.mark.parametrize("kind", sorted(DATA))
def test_tensors_pytrees_and_tensorclasses_as_lazy_tensor_storage(kind, tmp_path):
    make = DATA[kind]
    ref = ReplayBuffer(storage=LazyTensorStorage(7), batch_size=5)
    new = ReplayBuffer(storage=ZarrStorage(7, path=tmp_path / "b", durable=False), batch_size=5)
    g = 0
    for n in (3, 1, 9, 4):
        if n == 1:  # rb.add: one item without the leading dim
            item = make(1, g)
            one = (
                item[0]
                if kind == "tensorclass"
                else torch.utils._pytree.tree_map(lambda t: t[0], item)
            )
            assert ref.add(one) == new.add(one)
        else:
            assert torch.equal(ref.extend(make(n, g)), new.extend(make(n, g)))
        g += n
        assert len(ref) == len(new)
        for idx in (slice(None), torch.tensor([0, -1, 0]), 1):
            a, b = ref[idx], new[idx]
            assert type(a) is type(b), kind
            same_tree(as_tree(a), as_tree(b), f"{kind} [{idx}] after {g}")
        torch.manual_seed(g)
        a = ref.sample()
        torch.manual_seed(g)
        b = new.sample()
        same_tree(as_tree(a), as_tree(b), f"{kind} sample after {g}")
    expected = new[:]
    new.storage.close()
    again = ZarrStorage(7, path=tmp_path / "b")  # the form is recorded with the buffer
    same_tree(as_tree(again[:]), as_tree(expected), f"{kind} reopened")
    if kind == "tensor":
        assert torch.equal(again.state_dict()["_storage"], ref.storage.state_dict()["_storage"])
    again.close()


def test_a_list_of_items_is_stacked_as_torchrl_does(tmp_path):
    ref = ReplayBuffer(storage=LazyTensorStorage(5), batch_size=2)
    new = ReplayBuffer(storage=ZarrStorage(5, path=tmp_path / "b"), batch_size=2)
    items = [{"x": torch.tensor([i]), "y": (torch.zeros(2) + i,)} for i in range(3)]
    ref.extend(items)
    new.extend(items)
    same_tree(ref[:], new[:], "list of pytrees")


def test_nested_tensorclasses_and_ragged_lazy_stacks_come_back_as_they_went_in(tmp_path):
    outer = Outer(
        obs=torch.arange(6.0).view(3, 2),
        next=Step(obs=torch.ones(3, 1), reward=torch.arange(3.0), batch_size=[3]),
        batch_size=[3],
    )
    ragged = LazyStackedTensorDict(  # a collector's heterogeneous envs: stacked along dim 1
        TensorDict(a=torch.arange(40.0).view(5, 4, 2), batch_size=5),
        TensorDict(a=-torch.arange(30.0).view(5, 3, 2), batch_size=5),
        stack_dim=1,
    )
    for name, data, n in (("outer", outer, 3), ("ragged", ragged, 5)):
        ref = ReplayBuffer(storage=LazyTensorStorage(6), batch_size=2)
        new = ReplayBuffer(storage=ZarrStorage(6, path=tmp_path / name), batch_size=2)
        ref.extend(data)
        new.extend(data)
        for idx in (slice(None), torch.tensor([2, 0]), 1):
            a, b = ref[idx], new[idx]
            assert type(a) is type(b) and a.shape == b.shape, (name, idx)
            if name == "ragged":
                a, b = a.tensordicts, b.tensordicts
                assert all(torch.equal(x["a"], y["a"]) for x, y in zip(a, b, strict=True))
            else:
                assert type(b.next) is Step and torch.equal(a.next.reward, b.next.reward)
        kind = type(new[0:2])
        new.storage.close()
        again = ZarrStorage(6, path=tmp_path / name)
        assert type(again[0:2]) is kind and len(again) == n
        again.close()
    rb = ReplayBuffer(storage=ZarrStorage(6, path=tmp_path / "rows"), batch_size=2)
    with pytest.raises(SchemaError, match="pad them"):  # rows of differing shapes
        rb.extend(LazyStackedTensorDict(TensorDict(a=torch.zeros(2)), TensorDict(a=torch.zeros(3))))


def test_a_list_that_does_not_stack_raises_as_torchrl_does(tmp_path):
    rb = ReplayBuffer(storage=ZarrStorage(6, path=tmp_path / "b"), batch_size=2)
    with pytest.raises(RuntimeError, match="Stacking the elements of the list") as err:
        rb.extend([torch.zeros(4), torch.zeros(1)])
    assert isinstance(err.value, StackError) and isinstance(err.value, SchemaError)
    assert len(rb) == 0 and rb.writer._cursor == 0


@pytest.mark.parametrize(
    "second",
    [
        lambda: torch.zeros(3, 2),  # a tensor into a pytree storage
        lambda: {"a": torch.zeros(3, 1)},  # another structure
        lambda: {**tree(3), "a": torch.zeros(3, 1)},  # another dtype
        lambda: TensorDict({"a": torch.zeros(3, 1)}, [3]),  # a TensorDict
    ],
)
def test_other_data_than_the_first_is_refused_before_anything_is_written(second, tmp_path):
    rb = ReplayBuffer(storage=ZarrStorage(8, path=tmp_path / "b"), batch_size=2)
    rb.extend(tree(4))
    rb.storage.flush()
    before = tree_state(tmp_path / "b")
    with pytest.raises(SchemaError):
        rb.extend(second())
    assert tree_state(tmp_path / "b") == before
    assert len(rb) == 4 and rb.writer._cursor == 4
    rb.extend(tree(2, 4))
    assert rb[:]["a"].ravel().tolist() == list(range(6))


def test_what_cannot_be_stored_says_so(tmp_path):
    rb = ReplayBuffer(storage=ZarrStorage(8, path=tmp_path / "b"), batch_size=2)
    with pytest.raises(SchemaError, match="pytrees of tensors"):
        rb.extend([("a", 1), ("b", 2)])
    with pytest.raises(SchemaError, match="cannot be recorded"):
        rb.extend({(1, 2): torch.zeros(3)})  # tuple keys: no serializable structure
    ragged = LazyStackedTensorDict(
        TensorDict({"x": torch.zeros(2)}, []), TensorDict({"x": torch.zeros(3)}, [])
    )
    with pytest.raises(SchemaError, match="pad them"):
        rb.extend(ragged)
    for meta in (torch.zeros(3, 2, device="meta"), {"a": torch.zeros(3, device="meta")}):
        with pytest.raises(SchemaError, match="meta device"):  # (TorchRL's writer puts its
            rb.storage.set(torch.arange(3), meta)  # cursor on the data's device first)
    with pytest.raises(SchemaError, match="bfloat16"):
        rb.extend(torch.zeros(3, 2, dtype=torch.bfloat16))
    with pytest.raises(SchemaError, match="complex64"):
        rb.extend(TensorDict({"z": torch.zeros(3, dtype=torch.complex64)}, [3]))
    with pytest.raises(SchemaError, match="NonTensorData"):
        rb.extend(TensorDict({"x": torch.zeros(3), "s": NonTensorData("a", batch_size=[3])}, [3]))
    assert (
        len(rb) == 0
        and not (tmp_path / "b" / "segments").exists()
        or (zreplay.open(tmp_path / "b").num_rows == 0)
    )


KEYS = ["c", "zarr.json", "a b", "_.63", "ключ", "x/y", ".hidden", "end."]


def test_any_key_name_tensordict_allows_comes_back(tmp_path):
    td = TensorDict(
        {k: torch.arange(4.0) + i for i, k in enumerate(KEYS)}
        | {("b", "c"): torch.ones(4, 2), ("n", "c", "c"): torch.zeros(4, dtype=torch.int8)},
        [4],
    )
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(6), batch_size=3)
    new = TensorDictReplayBuffer(storage=ZarrStorage(6, path=tmp_path / "b"), batch_size=3)
    ref.extend(td.clone())
    new.extend(td.clone())
    assert set(new[:].keys(True, True)) == set(ref[:].keys(True, True))
    for k in ref[:].keys(True, True):
        assert torch.equal(new[:][k], ref[:][k]), k
        assert torch.equal(new.storage.get(torch.tensor([1, 3]))[k], ref[[1, 3]][k]), k
    new.storage.flush()
    stored = set(zreplay.open(tmp_path / "b").keys())  # escaped on disk, never unsafe
    assert {"_.63", "_.5f2e3633", "b/_.63", "n/_.63/_.63"} <= stored  # c, _.63, (b, c)
    assert all(p not in {"c", "zarr.json"} for k in stored for p in k.split("/"))
    with pytest.raises(KeyNameError, match="shorten"):
        new.extend(TensorDict({"é" * 70: torch.zeros(2)}, [2]))
    assert len(new) == 4
    edge = ZarrStorage(2, path=tmp_path / "edge")  # an escaped name: at most 63 bytes
    edge.set(torch.arange(1), TensorDict({"c" * 62 + " ": torch.zeros(1)}, [1]))
    assert list(edge[0:1].keys()) == ["c" * 62 + " "]
    with pytest.raises(KeyNameError, match="63 bytes"):
        edge.set(torch.arange(1, 2), TensorDict({"c" * 63 + " ": torch.zeros(1)}, [1]))
    edge.close()


def test_a_slice_sampler_reads_an_escaped_end_key(tmp_path):
    done = torch.tensor([0, 0, 1, 0, 0, 1, 0, 0, 1, 0]).bool()[:, None]
    td = TensorDict({"obs": torch.arange(10.0), ("next", "c"): done}, [10])
    out = []
    for storage in (LazyTensorStorage(10), ZarrStorage(10, path=tmp_path / "b")):
        rb = TensorDictReplayBuffer(
            storage=storage,
            sampler=SliceSampler(slice_len=3, end_key=("next", "c")),
            batch_size=6,
        )
        rb.extend(td.clone())
        torch.manual_seed(0)
        out.append(rb.sample()["obs"])
    assert torch.equal(out[0], out[1])


# -- crossing a process boundary ---------------------------------------------------------


def test_a_pickled_storage_is_a_read_only_copy_that_follows_commits(tmp_path):
    rb = TensorDictReplayBuffer(storage=ZarrStorage(5, path=tmp_path / "b"), batch_size=4)
    rb.extend(TensorDict({"x": torch.arange(7)}, [7]))  # wrapped: slots show 5, 6, 2, 3, 4
    copy = pickle.loads(pickle.dumps(rb))  # pickling commits what was added
    assert type(copy.storage) is ZarrStorage and copy.storage.read_only
    assert not rb.storage.read_only
    assert copy.storage[:]["x"].tolist() == [5, 6, 2, 3, 4] and len(copy) == 5
    rb.extend(TensorDict({"x": torch.arange(7, 9)}, [2]))
    rb.storage.flush()
    assert copy.storage[:]["x"].tolist() == [5, 6, 2, 3, 4]  # what it was made with
    assert copy.storage.refresh() and copy.storage[:]["x"].tolist() == [5, 6, 7, 8, 4]
    assert not copy.storage.refresh()
    before = tree_state(tmp_path / "b")
    for write in (
        lambda: copy.extend(TensorDict({"x": torch.arange(2)}, [2])),
        lambda: copy.empty(),
        lambda: copy.storage.load_state_dict(rb.storage.state_dict()),
        lambda: copy.storage.dumps(tmp_path / "ckpt"),
    ):
        with pytest.raises(ReadOnlyError, match="read-only copy"):
            write()
    assert tree_state(tmp_path / "b") == before
    rb.empty()
    rb.storage.flush()
    assert copy.storage.refresh() and len(copy) == 0
    deep = pickle.loads(pickle.dumps(copy.storage))  # a copy of a copy
    assert deep.read_only and len(deep) == 0


def test_a_pickled_storage_shows_the_commit_it_was_pickled_at(tmp_path):
    st = ZarrStorage(10, path=tmp_path / "b")
    st.set(torch.arange(6), TensorDict({"x": torch.arange(6)}, [6]))
    blob = pickle.dumps(st)  # commits the 6 rows
    st.set(torch.arange(6, 8), TensorDict({"x": torch.arange(6, 8)}, [2]))
    st.flush()
    copy = pickle.loads(blob)  # unpickled after the writer went on
    assert len(copy) == 6 and copy[:]["x"].tolist() == list(range(6))
    again = pickle.loads(pickle.dumps(copy))  # a copy of the copy: the same commit
    assert len(again) == 6
    assert copy.refresh() and copy[:]["x"].tolist() == list(range(8))
    for c in (copy, again):
        c.close()
    st.close()


def test_a_refused_extend_on_a_read_only_copy_leaves_the_writer_where_it_was(tmp_path):
    rb = TensorDictReplayBuffer(storage=ZarrStorage(10, path=tmp_path / "b"), batch_size=2)
    rb.extend(TensorDict({"x": torch.arange(3)}, [3]))
    copy = pickle.loads(pickle.dumps(rb))
    for write in (
        lambda: copy.extend(TensorDict({"x": torch.arange(2)}, [2])),
        lambda: copy.add(TensorDict({"x": torch.tensor(7)}, [])),
    ):
        with pytest.raises(ReadOnlyError, match="read-only copy"):
            write()
        assert (copy._writer._cursor, copy._writer._write_count) == (3, 3)
    assert len(copy) == 3
    copy.storage.close()
    rb.storage.close()


def test_a_copy_of_an_emptied_storage_reads_as_the_storage(tmp_path):
    st = ZarrStorage(4, path=tmp_path / "b")
    st.set(torch.arange(3), TensorDict({"x": torch.arange(3)}, [3]))
    st._empty()
    copy = pickle.loads(pickle.dumps(st))
    assert copy.initialized == st.initialized
    assert copy[:].shape == st[:].shape == (0,) and copy[:]["x"].shape == (0,)
    copy.close()
    st.close()


def test_list_indices_give_the_batches_lazy_tensor_storage_gives(tmp_path):
    ref = LazyTensorStorage(10)
    st = ZarrStorage(10, path=tmp_path / "b")
    for s in (ref, st):
        s.set(torch.arange(4), TensorDict({"x": torch.arange(4)}, [4]))
    for index in ([[0, 1]], [[0, 1], [2, 3]], [[[3]]], [0, 2], [True, False, True, False]):
        assert st[index].batch_size == ref[index].batch_size, index
        assert st[index]["x"].tolist() == ref[index]["x"].tolist(), index
    st.close()


def test_a_max_size_past_what_row_numbers_hold_is_refused(tmp_path):
    with pytest.raises(ValueError, match="max_size"):
        ZarrStorage(2**63, path=tmp_path / "b")
    st = ZarrStorage(10, path=tmp_path / "b")  # the path was not taken
    assert st.max_size == 10
    st.close()


def test_a_temporary_storage_is_not_pickled(tmp_path):
    storage = ZarrStorage(5)
    with pytest.raises(TypeError, match="path="):
        pickle.dumps(storage)
    storage.close()


def _sample_in_child(rb, queue) -> None:
    torch.manual_seed(3)
    queue.put((len(rb), rb.sample()["x"].tolist(), type(rb.storage[0:2]).__name__))


def _tensorclass_in_child(storage, queue) -> None:
    queue.put(type(storage[0:2]).__name__)


def test_another_process_samples_a_pickled_buffer(tmp_path):
    rb = TensorDictReplayBuffer(storage=ZarrStorage(50, path=tmp_path / "b"), batch_size=8)
    rb.extend(TensorDict({"x": torch.arange(30)}, [30]))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_sample_in_child, args=(rb, queue))
    p.start()
    n, xs, _ = queue.get(timeout=120)
    p.join(60)
    assert p.exitcode == 0 and n == 30 and len(xs) == 8 and set(xs) <= set(range(30))
    st = ZarrStorage(4, path=tmp_path / "tc")
    st.set(torch.arange(3), DATA["tensorclass"](3, 0))
    p = ctx.Process(target=_tensorclass_in_child, args=(st, queue))
    p.start()
    assert queue.get(timeout=120) == "Step"  # importable there: the class comes back
    p.join(60)
    st.close()


def _collector(path: str, i: int) -> None:
    rb = TensorDictReplayBuffer(storage=ZarrStorage(50, path=path, writer_id=f"collector-{i}"))
    rb.extend(TensorDict({"x": torch.arange(10) + 100 * i}, [10]))
    rb.storage.close()


# A multi-process run (python -m pytest -m slow) of what one process checks quickly:
# test_torchrl.py::test_a_view_never_shows_a_row_the_ring_overwrote (collectors' rings).
@pytest.mark.slow
def test_collector_processes_each_write_a_storage_and_a_learner_reads_them_all(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_collector, args=(str(tmp_path / "b"), i)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    view = zreplay.open(tmp_path / "b")
    assert view.num_rows == 20
    xs = set(view.sample(200)["x"].ravel().tolist())
    assert xs <= set(range(10)) | set(range(100, 110)) and xs & {100, 101, 102, 103, 104}
    mine = ZarrStorage(50, path=tmp_path / "b", writer_id="collector-1")  # each its own ring
    assert mine[:]["x"].tolist() == list(range(100, 110))
    mine.close()


def test_a_tensorclass_not_importable_comes_back_as_a_tensordict(tmp_path):
    @tensorclass
    class Local:
        obs: torch.Tensor

    st = ZarrStorage(4, path=tmp_path / "b")
    st.set(torch.arange(2), Local(obs=torch.zeros(2, 3), batch_size=[2]))
    assert type(st[0:2]) is Local
    st.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = ZarrStorage(4, path=tmp_path / "b")
        got = again[0:2]
    assert type(got) is TensorDict and got["obs"].shape == (2, 3)
    assert any("cannot be imported" in str(w.message) for w in caught)
    again.close()


_EVIL = """
import pathlib, torch
from tensordict import tensorclass
pathlib.Path("ran.marker").write_text("evil.py ran")
@tensorclass
class Thing:
    obs: torch.Tensor
    reward: torch.Tensor
"""

_OPEN_IN_BUFFER = """
import sys, warnings
warnings.simplefilter("always")
if sys.argv[1] == "imported":
    import evil  # the user's own choice: the class is already imported
from zreplay.torchrl import ZarrStorage
kw = {"tensorclasses": [__import__("evil").Thing]} if sys.argv[1] == "allowed" else {}
with warnings.catch_warnings(record=True) as caught:
    st = ZarrStorage(4, path=".", **kw)
    got = st[0:2]
print(type(got).__name__, got.batch_size[0], [str(w.message)[:60] for w in caught])
st.close()
"""


@pytest.mark.parametrize("how", ["plain", "imported", "allowed"])
def test_a_buffer_naming_a_module_of_its_own_never_imports_it(how, tmp_path):
    # A downloaded buffer directory is the working directory of a REPL or `python -c`
    # (so on sys.path) and holds evil.py; its commit record names evil:Thing.
    import json
    import subprocess
    import sys

    buf = tmp_path / "b"
    st = ZarrStorage(4, path=buf)
    st.set(torch.arange(2), Step(obs=torch.zeros(2, 3), reward=torch.ones(2), batch_size=[2]))
    st.close()
    commit = buf / "segments" / "default" / "zreplay" / "commit.json"
    record = json.loads(commit.read_text())
    assert record["sampler"]["facade"]["form"]["classes"] == {"": "test_torchrl_forms:Step"}
    record["sampler"]["facade"]["form"]["classes"] = {"": "evil:Thing"}
    commit.write_text(json.dumps(record))
    (buf / "evil.py").write_text(_EVIL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", _OPEN_IN_BUFFER, how],
        cwd=buf,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    kind, rows, warned = out.stdout.strip().splitlines()[-1].split(" ", 2)
    assert rows == "2"
    if how == "plain":
        assert not (buf / "ran.marker").exists()  # evil.py never ran
        assert kind == "TensorDict" and "evil:Thing" in warned
    else:  # the user imported or listed the class: it comes back
        assert kind == "Thing" and "evil:Thing" not in warned


# -- ndim > 1: [envs, time] batches -------------------------------------------------------


def env_batch(t: int, start: int, envs: int = 2) -> TensorDict:
    """``[envs, t]`` steps; ``g`` numbers them env-major."""
    g = torch.arange(start, start + envs * t).view(envs, t)
    return TensorDict(
        {
            "g": g,
            "obs": g[..., None].float().expand(envs, t, 3).clone(),
            ("next", "done"): (g % 5 == 4)[..., None],
        },
        [envs, t],
    )


def test_ndim_2_storage_as_lazy_tensor_storage(tmp_path):
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(22, ndim=2), batch_size=6)
    new = TensorDictReplayBuffer(
        storage=ZarrStorage(22, path=tmp_path / "b", ndim=2, durable=False), batch_size=6
    )
    g = 0
    for t in (2, 3, 2, 4, 5, 9):  # wraps the 11 slots along time
        assert torch.equal(ref.extend(env_batch(t, g)), new.extend(env_batch(t, g)))
        g += 2 * t
        A, B = ref.storage, new.storage
        assert (len(A), A.shape, A.max_size, A._is_full) == (
            len(B),
            B.shape,
            B.max_size,
            B._is_full,
        )
        for idx in (
            (torch.tensor([0, 1, -1]), torch.tensor([1, 0, 1])),  # what samplers pass
            1,
            torch.tensor([0, 0, -1]),
            slice(1, None),
            (slice(None), 1),
        ):
            x, y = A[idx], B[idx]
            assert x.shape == y.shape and torch.equal(x["g"], y["g"]), (t, idx)
        torch.manual_seed(g)
        x = ref.sample()
        torch.manual_seed(g)
        y = new.sample()
        assert torch.equal(x["g"], y["g"]) and torch.equal(x["index"], y["index"])
    assert new.storage.core.num_rows <= 11 + 11 - 1  # rows along time: bounded by the ring
    new.storage.close()
    again = ZarrStorage(22, path=tmp_path / "b", ndim=2)
    assert again.shape == ref.storage.shape and torch.equal(again[:]["g"], ref.storage[:]["g"])
    again.close()
    with pytest.raises(ValueError, match="ndim=2"):
        ZarrStorage(22, path=tmp_path / "b")  # another ndim is refused, as another max_size


def test_ndim_2_state_dicts_cross_with_lazy_tensor_storage(tmp_path):
    ref = LazyTensorStorage(12, ndim=2)
    rb = TensorDictReplayBuffer(storage=ref, batch_size=2)
    rb.extend(env_batch(4, 0, envs=3))
    new = ZarrStorage(12, path=tmp_path / "b", ndim=2)
    new.load_state_dict(ref.state_dict())
    assert len(new) == 12 and new.shape == ref.shape and torch.equal(new[:]["g"], ref[:]["g"])
    back = LazyTensorStorage(12, ndim=2)
    back.load_state_dict(new.state_dict())
    assert torch.equal(back[:]["g"], ref[:]["g"])
    new.close()


def test_ndim_needs_that_many_batch_dims(tmp_path):
    st = ZarrStorage(10, path=tmp_path / "b", ndim=3)
    with pytest.raises(SchemaError, match="at least 3 batch dims"):
        st.set(torch.arange(2), env_batch(2, 0))
    assert len(st) == 0 and st.shape is None
    st.set(torch.arange(2), TensorDict({"x": torch.zeros(2, 2, 3)}, [2, 2, 3]))
    assert st.shape == (2, 2, 3) and len(st) == 12 and st.max_size == 12
    st.close()


# -- durability --------------------------------------------------------------------------

KILLED_AFTER_EXTEND = """
import sys, time, torch
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer
from zreplay.torchrl import ZarrStorage
rb = TensorDictReplayBuffer(storage=ZarrStorage(100, path=sys.argv[1], flush_each_extend=True))
for i in range(3):
    rb.extend(TensorDict({"x": torch.arange(10) + 10 * i}, [10]))
print("extended", flush=True)
time.sleep(600)
"""


def test_flush_each_extend_survives_kill_9_right_after_extend(tmp_path):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_AFTER_EXTEND, str(tmp_path / "b")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "extended"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    again = ZarrStorage(100, path=tmp_path / "b", break_lock=True)
    assert len(again) == 30 and again[:]["x"].tolist() == list(range(30))
    again.close()


def test_a_buffer_the_program_dropped_reopens_with_its_rows(tmp_path):
    """No close(): TorchRL code drops its buffer; the next construction on the path (this
    process, as a notebook cell run again) resumes it, rows and cursor."""
    import gc

    rb = TensorDictReplayBuffer(storage=ZarrStorage(8, path=tmp_path / "b"), batch_size=2)
    rb.extend(TensorDict({"x": torch.arange(11)}, [11]))
    del rb
    gc.collect()
    again = TensorDictReplayBuffer(storage=ZarrStorage(8, path=tmp_path / "b"), batch_size=2)
    assert len(again) == 8 and again.writer._cursor == 3
    assert again[:]["x"].tolist() == [8, 9, 10, 3, 4, 5, 6, 7]
    again.extend(TensorDict({"x": torch.arange(11, 13)}, [2]))
    assert again[:]["x"].tolist() == [8, 9, 10, 11, 12, 5, 6, 7]


def test_a_commit_of_the_first_ndim_extend_holds_its_dims(tmp_path):
    """The background writer may commit between the rows' add and the end of ``set``: the
    dims must already be in that commit, or a crash there reopens a ring of the wrong
    size over the rows."""
    st = ZarrStorage(12, path=tmp_path / "b", ndim=2)
    seen = []
    add = st.core.add

    def add_then_commit(items):
        out = add(items)
        st.core.flush()  # what the committer may do at any moment
        seen.append(pickle.loads(pickle.dumps(st)))  # a read-only copy of that commit
        return out

    st.core.add = add_then_commit
    st.set(torch.arange(3), env_batch(2, 0, envs=3))  # [3, 2]: 3 slots of 2
    del st.core.add
    copy = seen[0]
    assert copy.shape == (3, 2) and len(copy) == 6 and torch.equal(copy[:]["g"], st[:]["g"])
    st.close()


# -- found by an adversarial pass ----------------------------------------------------------


def test_a_read_only_copy_follows_its_writer_once_its_rows_left_the_disk(tmp_path):
    def rows(a, b):
        g = torch.arange(a, b)
        return TensorDict({"g": g, "obs": g.float()[:, None].expand(b - a, 300).clone()}, [b - a])

    rb = TensorDictReplayBuffer(storage=ZarrStorage(4, path=tmp_path / "b", durable=False))
    rb.extend(rows(0, 4))
    rb.extend(rows(4, 11))  # wrapped: the seam is after slot 2
    copy = pickle.loads(pickle.dumps(rb.storage))

    def last(st):
        return int(torch.as_tensor(st._last_cursor).reshape(-1)[-1])

    assert last(copy) == last(rb.storage) == 2  # SliceSampler's seam
    for i in range(5):  # wraps evict the rows the copy showed
        rb.extend(rows(100 + 4 * i, 104 + 4 * i))
    rb.storage.flush()
    got = copy.get(torch.arange(4))  # the reader moved on: the copy follows, whole rows
    assert got["g"].tolist() == rb.storage.get(torch.arange(4))["g"].tolist()
    assert torch.equal(got["obs"][:, 0], got["g"].float())
    copy.close()


def test_an_extend_interrupted_after_its_rows_went_in_keeps_them_and_the_cursor(tmp_path):
    st = ZarrStorage(6, path=tmp_path / "b")
    rb = TensorDictReplayBuffer(storage=st, batch_size=2)
    rb.extend(TensorDict({"g": torch.arange(2)}, [2]))
    add = st.core.add

    def add_then_interrupt(items):
        add(items)
        raise KeyboardInterrupt  # Ctrl-C as the add returns

    def interrupt(items):
        raise KeyboardInterrupt  # Ctrl-C before the add

    st.flush()
    before = tree_state(tmp_path / "b")
    st.core.add = interrupt
    with pytest.raises(KeyboardInterrupt):
        rb.extend(TensorDict({"g": torch.arange(2, 4)}, [2]))
    assert len(rb) == 2 and rb.writer._cursor == 2 and rb.write_count == 2
    assert tree_state(tmp_path / "b") == before
    st.core.add = add_then_interrupt
    with pytest.raises(KeyboardInterrupt):
        rb.extend(TensorDict({"g": torch.arange(2, 4)}, [2]))
    del st.core.add
    assert len(rb) == 4 and rb.writer._cursor == 4 and rb.write_count == 4  # it went in
    rb.extend(TensorDict({"g": torch.arange(4, 7)}, [3]))
    assert rb[:]["g"].tolist() == [6, 1, 2, 3, 4, 5]
    st.close()
    assert ZarrStorage(6, path=tmp_path / "b")[:]["g"].tolist() == [6, 1, 2, 3, 4, 5]


def test_a_state_dict_keeps_the_storages_tensorclass(tmp_path):
    rb = ReplayBuffer(storage=ZarrStorage(4, path=tmp_path / "b"), batch_size=2)
    rb.extend(DATA["tensorclass"](3, 0))
    rb.load_state_dict(rb.state_dict())  # TensorDicts in the state dict, as TorchRL's
    assert type(rb[0:2]) is Step
    rb.extend(DATA["tensorclass"](2, 3))  # still the same kind of data
    assert rb[:].obs.ravel().tolist() == [4.0, 1.0, 2.0, 3.0]


def test_ndim_state_dicts_of_a_ring_not_full_and_a_refused_one(tmp_path):
    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(12, ndim=2), batch_size=2)
    new = TensorDictReplayBuffer(storage=ZarrStorage(12, path=tmp_path / "b", ndim=2))
    ref.extend(env_batch(2, 0))
    new.extend(env_batch(2, 0))
    a, b = ref.storage.state_dict(), new.storage.state_dict()
    assert a["_len"] == b["_len"] == 4  # TorchRL's slots past len hold torch.empty's bytes
    assert torch.equal(a["_storage"]["g"][:2], b["_storage"]["g"][:2])
    wrong = LazyTensorStorage(30, ndim=2)
    TensorDictReplayBuffer(storage=wrong).extend(env_batch(3, 0, envs=2))
    before = (len(new), new.storage.max_size, new.storage.shape, new.writer._cursor)
    with pytest.raises(ValueError, match="max_size=30"):
        new.storage.load_state_dict(wrong.state_dict())
    assert (len(new), new.storage.max_size, new.storage.shape, new.writer._cursor) == before
    ref.extend(env_batch(3, 4))
    new.extend(env_batch(3, 4))
    assert torch.equal(ref.storage[:]["g"], new.storage[:]["g"])


def test_ndim_3_ellipsis_and_none_indices_as_torch(tmp_path):
    td = TensorDict({"x": torch.arange(60.0).view(5, 2, 3, 2)}, [5, 2, 3])
    ref, new = LazyTensorStorage(30, ndim=3), ZarrStorage(30, path=tmp_path / "b", ndim=3)
    for st in (ref, new):
        st.set(torch.arange(5), td)
    for idx in ((..., 0), (1, ..., 2), (None, 0), (slice(None), None, 1)):
        assert torch.equal(ref[idx]["x"], new[idx]["x"]), idx


def test_a_ragged_lazy_stack_of_another_shape_is_a_schema_error(tmp_path):
    def ragged(k: int):
        return LazyStackedTensorDict(
            TensorDict(x=torch.zeros(3, 4), batch_size=3),
            TensorDict(x=torch.zeros(3, k), batch_size=3),
            stack_dim=1,
        )

    rb = ReplayBuffer(storage=ZarrStorage(6, path=tmp_path / "b"), batch_size=2)
    rb.extend(ragged(2))
    with pytest.raises(SchemaError, match="_.item1"):
        rb.extend(ragged(5))
    assert len(rb) == 3


def test_a_read_only_copy_of_an_emptied_storage_reads_as_the_writer(tmp_path):
    rb = TensorDictReplayBuffer(storage=ZarrStorage(4, path=tmp_path / "b"), batch_size=2)
    rb.extend(TensorDict({"x": torch.arange(3)}, [3]))
    copy = pickle.loads(pickle.dumps(rb.storage))
    rb.empty()
    rb.storage.flush()
    assert copy.refresh() and len(copy) == 0
    assert copy[:].shape == rb.storage[:].shape == (0,)
    assert copy[:]["x"].shape == (0,)
    rb.extend(TensorDict({"x": torch.arange(5, 7)}, [2]))
    rb.storage.flush()
    assert copy.refresh() and copy[:]["x"].tolist() == [5, 6]
    copy.close()


def test_a_buffer_written_before_forms_were_recorded_reads_as_tensordicts(tmp_path):
    import json

    st = ZarrStorage(5, path=tmp_path / "b")
    st.set(torch.arange(3), TensorDict({"x": torch.arange(3), ("n", "y"): torch.ones(3, 2)}, [3]))
    st.close()
    commit = tmp_path / "b" / "segments" / "default" / "zreplay" / "commit.json"
    record = json.loads(commit.read_text())
    facade = record["sampler"]["facade"]
    for name in ("form", "ndim", "dims"):  # what an earlier version wrote
        del facade[name]
    facade["batches"] = {"": [], "n": []}
    commit.write_text(json.dumps(record))
    again = ZarrStorage(5, path=tmp_path / "b")
    got = again[:]
    assert type(got).__name__ == "_SubTensorDict" and got["x"].tolist() == [0, 1, 2]
    again.set(
        torch.arange(3, 4), TensorDict({"x": torch.tensor([3]), ("n", "y"): torch.ones(1, 2)}, [1])
    )
    assert again.get(torch.arange(4))["n", "y"].shape == (4, 2)
    again.close()


def test_numpy_and_torch_scalars_where_ints_are_expected(tmp_path):
    import numpy as np

    st = ZarrStorage(np.int64(8), path=tmp_path / "b", ndim=torch.tensor(2))
    assert (st.max_size, st.ndim) == (8, 2)
    st.set(np.arange(2), TensorDict({"x": torch.arange(6.0).view(2, 3)}, [2, 3]))
    st.set(np.int64(2), TensorDict({"x": torch.ones(3)}, [3]))  # one item: add
    assert len(st) == 9 and st.shape == (3, 3) and st._last_cursor_index == 2
    assert st[2]["x"].tolist() == [1.0, 1.0, 1.0]
    for bad in (2.5, "8"):
        with pytest.raises((TypeError, ValueError)):
            ZarrStorage(bad, path=tmp_path / "bad")
    st.close()


@pytest.mark.parametrize(
    "field, value",
    [
        ("items", 200_000),  # one row would become 200,000 made-up items
        ("stack_dim", 40),
        ("start", -3),
        ("shift", 10**12),
        ("max_size", 2**63),
    ],
)
def test_a_crafted_number_in_the_storages_record_is_a_corrupt_buffer(field, value, tmp_path):
    import json

    from zreplay.errors import CorruptBufferError

    ragged = LazyStackedTensorDict(
        TensorDict(x=torch.zeros(3, 4), batch_size=3),
        TensorDict(x=torch.zeros(3, 2), batch_size=3),
        stack_dim=1,
    )
    st = ZarrStorage(6, path=tmp_path / "b")
    st.set(torch.arange(3), ragged)
    st.close()
    assert zreplay.verify(tmp_path / "b").ok
    commit = tmp_path / "b" / "segments" / "default" / "zreplay" / "commit.json"
    record = json.loads(commit.read_text())
    facade = record["sampler"]["facade"]
    if field in ("items", "stack_dim"):
        spec = json.loads(facade["form"]["spec"])
        spec[field] = value
        facade["form"]["spec"] = json.dumps(spec)
    else:
        facade[field] = value
    commit.write_text(json.dumps(record))
    with pytest.raises(CorruptBufferError, match=rf"commit\.json.*{field}"):
        ZarrStorage(6, path=tmp_path / "b")
    report = zreplay.verify(tmp_path / "b")
    assert not report.ok and any(field in p and "commit.json" in p for p in report.problems)


def test_crafted_numbers_in_a_checkpoint_are_refused_before_it_is_loaded(tmp_path):
    import json

    from torchrl.data import LazyMemmapStorage

    from zreplay.errors import CorruptBufferError

    ragged = LazyStackedTensorDict(
        TensorDict(x=torch.zeros(3, 4), batch_size=3),
        TensorDict(x=torch.zeros(3, 2), batch_size=3),
        stack_dim=1,
    )
    src = ReplayBuffer(storage=ZarrStorage(6, path=tmp_path / "src"))
    src.extend(ragged)
    src.dumps(tmp_path / "ck")
    src.storage.close()
    commit = tmp_path / "ck" / "storage" / "segments" / "default" / "zreplay" / "commit.json"
    record = json.loads(commit.read_text())
    spec = json.loads(record["sampler"]["facade"]["form"]["spec"])
    record["sampler"]["facade"]["form"]["spec"] = json.dumps(dict(spec, items=200_000))
    commit.write_text(json.dumps(record))
    rb = ReplayBuffer(storage=ZarrStorage(6, path=tmp_path / "b"))
    rb.extend(TensorDict(x=torch.arange(2)[:, None].float(), batch_size=2))
    with pytest.raises(CorruptBufferError, match="items"):
        rb.loads(tmp_path / "ck")
    assert rb.storage[:]["x"].tolist() == [[0.0], [1.0]]  # nothing was taken over

    mm = ReplayBuffer(storage=LazyMemmapStorage(6, scratch_dir=tmp_path / "scratch"))
    mm.extend(TensorDict(x=torch.arange(4)[:, None].float(), batch_size=4))
    mm.dumps(tmp_path / "torchrl_ck")
    meta = tmp_path / "torchrl_ck" / "writer" / "metadata.json"
    meta.write_text(json.dumps(dict(json.loads(meta.read_text()), cursor=10**15)))
    with pytest.raises(CorruptBufferError, match="cursor"):
        rb.loads(tmp_path / "torchrl_ck")
    assert rb.storage[:]["x"].tolist() == [[0.0], [1.0]]
    rb.storage.close()
