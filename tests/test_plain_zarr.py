"""A buffer is a plain Zarr hierarchy: zarr walks it without a warning, in every state a
user can meet (several writers, saved priorities, a live writer's lock, a checkpoint, a
killed writer's debris), FORMAT.md's recipe reads every trajectory and episode with zarr
and json alone, and buffers written in formats 2-4 are refused until ``zreplay upgrade``
rewrote them (tests/test_upgrade.py)."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import warnings
from contextlib import closing
from pathlib import Path

import builders
import numpy as np
import pytest
import zarr
from conftest import check_rows, codes_of, make_traj, shard_files, traj_equal

import zreplay
from zreplay.core import Prepared
from zreplay.errors import FormatError, ZReplayError
from zreplay.samplers import Prioritized
from zreplay.schema import flatten
from zreplay.store.commit import read_commit
from zreplay.store.format import FORMAT_VERSION
from zreplay.store.layout import shard_number

DATA = Path(__file__).parent / "data"


def walk_without_warnings(path) -> list[str]:
    """Every node name of the hierarchy, with every warning turned into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return sorted(name for name, _ in zarr.open_group(path, mode="r").members(max_depth=None))


def test_zarr_walks_every_kind_of_buffer_without_warnings(tmp_path):
    path = tmp_path / "b"
    a = builders.writer(path, writer_id="a", sampler=Prioritized())
    b = builders.writer(path, writer_id="b")
    builders.add_full(a, range(3))
    builders.add_full(b, [10])
    a.flush(), b.flush()
    # live writers: locks held, priorities saved, writer numbers claimed
    names = walk_without_warnings(path)
    assert "segments/a/priority/0" in names and "segments/a/zreplay" in names
    a.engine.checkpoint(tmp_path / "ckpt")
    assert "segments/a/data/actions" in walk_without_warnings(tmp_path / "ckpt")
    # a killed writer's temp file of a commit in flight sits in the meta node too
    (path / "segments" / "a" / "zreplay" / "commit.json.1.2.tmp").write_text("{")
    walk_without_warnings(path)
    a.close(), b.close()
    walk_without_warnings(path)


def _as_format_2(path) -> None:
    """Move a buffer's own files back where format 2 kept them."""
    root = zarr.open_group(path, mode="r+")
    root.attrs["zreplay"] = {**root.attrs["zreplay"], "format": 2}
    for seg in (path / "segments").iterdir():
        if not seg.is_dir():
            continue
        meta = seg / "zreplay"
        c = json.loads((meta / "commit.json").read_text())
        (seg / "commit.json").write_text(json.dumps({**c, "format": 2}))
        shutil.rmtree(meta)
    os.rename(path / "zreplay" / "writers", path / "writers")
    shutil.rmtree(path / "zreplay")


def test_format_2_buffers_are_refused_until_upgraded(tmp_path):
    path = tmp_path / "b"
    for wid in ("a", "b"):
        with closing(builders.writer(path, writer_id=wid)) as buf:
            builders.add_full(buf, range(2))
    before = zreplay.open(path).sample(64, keys=["actions"])
    _as_format_2(path)
    with pytest.raises(FormatError, match="zreplay upgrade"):
        zreplay.open(path)
    assert zreplay.upgrade(path) == 2
    view = zreplay.open(path)
    assert view.num_trajectories == 4
    check_rows(view.sample(128))
    buf = builders.writer(path, writer_id="a")
    assert buf.num_trajectories == 2 and builders.add_full(buf, [5])[0] == 2
    buf.flush()
    assert zarr.open_group(path, mode="r").attrs["zreplay"]["format"] == FORMAT_VERSION
    assert not (path / "segments" / "a" / "commit.json").exists()
    assert (path / "segments" / "a" / "zreplay" / "commit.json").is_file()
    assert sorted(os.listdir(path / "zreplay" / "writers")) == ["0", "1"]  # claims kept
    view = zreplay.open(path)
    assert view.num_trajectories == 5 and view.writer_ids == ["a", "b"]
    assert (
        zreplay.open(path).sample(64, keys=["actions"])["actions"].shape == before["actions"].shape
    )
    buf.close()
    builders.writer(path, writer_id="b").close()
    walk_without_warnings(path)
    assert zreplay.verify(path).ok


def _nested_and_flat(path) -> tuple[list, list]:
    """Shard files of every data array under ``path``: nested ``c/<s>/0...`` ones and
    flat ``c.<s>.0...`` ones."""
    nested, flat = [], []
    for r, _, names in os.walk(path):
        if "/data/" not in r + "/":
            continue
        for n in names:
            if n.startswith("c.") and not n.endswith((".tmp", ".__lock", ".partial")):
                flat.append(os.path.join(r, n))
            elif f"{os.sep}c{os.sep}" in r + os.sep and n.isdigit():
                nested.append(os.path.join(r, n))
    return nested, flat


def test_format_4_buffers_keep_nested_chunk_keys_and_are_upgraded(tmp_path):
    """tests/data/format4-buffer.tar.gz was written by zreplay at e574596 (format 4: chunk
    keys c/<shard>/0/...): two writers, writer a with capacity 90 (8 trajectories of 18
    rows added: rows below 54 evicted, shards below row 48 reclaimed), small shards for
    three keys.  It is refused until upgraded; then its writers keep its layout (nested
    keys) through eviction, reclaim, checkpoints and loads."""
    with tarfile.open(DATA / "format4-buffer.tar.gz") as t:
        t.extractall(tmp_path, filter="data")
    path = tmp_path / "fmt4"
    assert zarr.open_group(path, mode="r").attrs["zreplay"]["format"] == 4
    with pytest.raises(FormatError, match="zreplay upgrade"):
        zreplay.open(path)
    assert zreplay.upgrade(path) == 4
    view = zreplay.open(path, seed=1)
    assert view.num_trajectories == 5 + 2
    codes = check_rows(view.sample(256))
    assert set(codes // 10000) == {3, 4, 5, 6, 7, 100, 101}  # 0-2 were evicted
    assert zreplay.verify(path).ok
    assert _nested_and_flat(path)[1] == []

    buf = builders.writer(path, writer_id="a", capacity=90)
    assert zarr.open_group(path, mode="r").attrs["zreplay"]["format"] == FORMAT_VERSION
    builders.add_full(buf, range(8, 14))
    buf.flush()
    commit = read_commit(path / "segments" / "a")
    assert commit.reclaimed_below >= 144  # shards of the old rows went
    nested, flat = _nested_and_flat(path / "segments" / "a")
    assert nested and flat == []  # still c/<shard>/0/..., as its layout says
    for key in ("curr_obs/main_images", "actions"):
        array = path / "segments" / "a" / "data" / key
        shards = [int(p.relative_to(array).parts[1]) for p in shard_files(path, key, "a")]
        assert shards[0] == commit.reclaimed_below // 16, (key, shards)
    for r, dirs, files in os.walk(path):
        assert dirs or files, f"empty directory {r}"
    check_rows(builders.nested(buf.sample(128)))
    buf.engine.checkpoint(tmp_path / "ck")
    buf.close()

    other = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "new"))
    other.add_trajectories([make_traj(50)])  # a format-5 buffer: flat keys ...
    other.flush()
    assert _nested_and_flat(tmp_path / "new")[1]
    other.load_checkpoint(str(tmp_path / "ck"))  # ... takes the checkpoint's nested ones
    assert set(codes_of(other.sample(256)) // 10000) == set(range(9, 14))
    other.add_trajectories([make_traj(60)])
    other.flush()
    nested, flat = _nested_and_flat(tmp_path / "new")
    assert nested and flat == []
    check_rows(other.sample(256))
    other.close()
    # emptied and refilled: its arrays are made again, flat
    with closing(builders.writer(path, writer_id="b")) as b:
        b.engine.clear()
        builders.add_full(b, [90])
        b.flush()
    nested, flat = _nested_and_flat(path / "segments" / "b")
    assert nested == [] and flat
    for p in (path, tmp_path / "new"):
        walk_without_warnings(p)
        assert zreplay.verify(p).ok
    data, live = _plain_rows(tmp_path / "new")
    assert live[1] - live[0] == 6 * 18 and len(data["actions"]) == live[1]


def _shards_below(path, writer: str, below_row: int) -> list:
    """Shard files of ``writer``'s data arrays that hold only rows below ``below_row``."""
    layouts = zarr.open_group(path, mode="r").attrs["zreplay"]["layout"]
    stale = []
    for key, lay in layouts.items():
        array = path / "segments" / writer / "data" / key
        for f in shard_files(path, key, writer):
            s = shard_number(f.relative_to(array).as_posix())
            if (s + 1) * lay["shard_rows"] <= below_row:
                stale.append(f)
    return stale


def _plain_rows(path, writer: str = "default") -> tuple[dict, list[int]]:
    """What plain zarr shows of a segment: each data key's rows, and ``live_rows``."""
    g = zarr.open_group(path, mode="r")
    seg = g[f"segments/{writer}"]
    data = {name: arr[...] for name, arr in seg["data"].arrays()}
    return data, seg.attrs["live_rows"]


def test_plain_zarr_shows_exactly_the_committed_rows_and_evicted_rows_as_zeros(tmp_path):
    """After every commit, zarr (and TensorStore) show each data array exactly as long as
    the commit's rows; ``live_rows`` says where the live ones begin; evicted rows whose shard
    is gone read as the fill value, and the live rows are what zreplay returns."""
    import tensorstore as ts

    path = tmp_path / "b"
    layout = {"obs": {"chunk_rows": 8, "shard_rows": 16}}
    buf = builders.writer(path, capacity=60, layout=layout)
    rows = []  # every row ever added, in stored order (env-major within a trajectory)
    for i in range(12):
        obs = np.arange(i * 100, i * 100 + 10, dtype=np.float32).reshape(5, 2)  # T=5, B=2
        buf.add([Prepared({"obs": obs, "reward": obs * 2}, 5, 2)])
        rows.extend(obs.T.reshape(-1))
        buf.flush()
        commit = json.loads((path / "segments/default/zreplay/commit.json").read_text())
        n, low = commit["n_rows"], commit["low_row"]
        data, live = _plain_rows(path)
        assert live == [low, n] and n == len(rows)
        for name, got in data.items():
            assert got.shape == (n,), name
            np.testing.assert_array_equal(
                got[low:], np.array(rows[low:]) * (2 if name == "reward" else 1)
            )
        ts_obs = ts.open(
            {
                "driver": "zarr3",
                "kvstore": {"driver": "file", "path": str(path / "segments/default/data/obs")},
            }
        ).result()
        assert ts_obs.shape == (n,)
        assert buf.num_trajectories == min(i + 1, 6)
        np.testing.assert_array_equal(
            np.sort(data["obs"][low:]), np.sort(zreplay.open(path).rows(np.arange(n - low))["obs"])
        )
    # 120 rows added, 60 live: the shards of rows [0, 48) are gone and read as zeros
    assert low == 60
    assert not np.any(data["obs"][:48]) and np.all(data["obs"][60:] > 0)
    assert [int(p.name.split(".")[1]) for p in shard_files(path, "obs")] == [3, 4, 5, 6, 7]
    # the index arrays are zreplay's bookkeeping, grown ahead: at least what the commit needs
    g = zarr.open_group(path, mode="r")
    assert g["segments/default/offsets"].shape[0] >= 13
    buf.close()


def test_a_commit_killed_after_its_arrays_grew_is_cut_back_by_the_next_writer(tmp_path):
    """Arrays grow before a commit's rows are written: a writer killed in between leaves
    them longer than the commit (zreplay reads by the commit); the next writer cuts them
    back before anything else."""
    path = tmp_path / "b"
    with closing(builders.writer(path)) as buf:
        builders.add_full(buf, range(2))
    n = 36
    longer = 1000  # as a killed commit leaves them (metadata only)
    for _, arr in zarr.open_group(path / "segments/default/data", mode="r+").arrays():
        arr.resize((longer, *arr.shape[1:]))
    data, _ = _plain_rows(path)
    assert {v.shape[0] for v in data.values()} == {longer}
    view = zreplay.open(path)
    assert view.num_rows == n
    check_rows(view.sample(64))
    buf = builders.writer(path)
    data, live = _plain_rows(path)
    assert {v.shape[0] for v in data.values()} == {n} and live == [0, n]
    builders.add_full(buf, [2])
    buf.close()
    data, live = _plain_rows(path)
    assert {v.shape[0] for v in data.values()} == {n + 18} and live == [0, n + 18]
    assert zreplay.verify(path).ok


def _opens_while_following(tmp_path, monkeypatch, commits: int, forked: bool):
    """How often each array is opened by a view that refreshes after each of ``commits``
    commits and reads the newest rows (``forked``: through zarr-python, as a process
    forked from another reads)."""
    from collections import Counter

    from zreplay import forks
    from zreplay.store import arrays

    path = tmp_path / "b"
    buf = builders.writer(path)
    builders.add_full(buf, [0])
    buf.flush()  # the writer's arrays are open (TensorStore) before the reader "forks"
    opened = Counter()
    real_open = arrays.ArrayHandle._open

    def counting_open(self):
        opened[str(self.path)] += 1
        return real_open(self)

    monkeypatch.setattr(arrays.ArrayHandle, "_open", counting_open)
    if forked:
        monkeypatch.setattr(forks, "_FORKED", True)  # the reader reads as a forked child does
    view = zreplay.open(path)
    opened.clear()
    for i in range(1, commits + 1):
        builders.add_full(buf, [i])
        buf.flush()
        view.refresh()
        assert view.num_trajectories == i + 1
        check_rows(view.rows(np.arange(view.num_rows - 18, view.num_rows)))  # the newest
    monkeypatch.setattr(forks, "_FORKED", False)
    buf.close()
    assert opened
    return opened


def test_a_reader_following_a_writer_reopens_its_arrays_rarely(tmp_path, monkeypatch):
    """Arrays grow at every commit; a reader that refreshes after each one takes them
    for longer than they are (it reads committed rows only), so it reopens each array
    a logarithmic number of times, not once per commit."""
    opened = _opens_while_following(tmp_path, monkeypatch, 64, forked=False)
    assert max(opened.values()) <= 8, opened.most_common(3)


# zreplay says (once per program) that a forked reader reads through zarr-python
@pytest.mark.filterwarnings("ignore:zreplay. reading in a forked process")
def test_a_forked_reader_following_a_writer_reopens_its_arrays_rarely(tmp_path, monkeypatch):
    """The same through zarr-python, which a process forked from another reads with
    (DataLoader workers under "fork"): its handles are widened too."""
    opened = _opens_while_following(tmp_path, monkeypatch, 32, forked=True)
    assert max(opened.values()) <= 7, opened.most_common(3)


def test_a_segment_is_never_taken_for_a_buffer(tmp_path):
    """The segment group's attributes (live_rows) never make it look like a buffer root:
    a checkpoint saved onto another buffer's segment is refused, and that buffer keeps
    its rows."""
    from zreplay.store.root import is_buffer

    a_path = tmp_path / "a"
    with closing(builders.writer(a_path)) as a:
        builders.add_full(a, range(2))
    seg = a_path / "segments" / "default"
    assert zarr.open_group(seg, mode="r").attrs["live_rows"] == [0, 36]
    assert is_buffer(a_path) and not is_buffer(seg)
    with closing(builders.writer()) as b:
        builders.add_full(b, [5])
        with pytest.raises(ZReplayError):
            b.engine.checkpoint(seg)
    with pytest.raises(ZReplayError):
        builders.writer(seg, overwrite=True)
    assert zreplay.open(a_path).num_trajectories == 2 and zreplay.verify(a_path).ok


def _die_writing_rows(path: str) -> None:
    """A writer killed as the rows of its fourth commit start going out."""
    from zreplay.store import segment

    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path, capacity=3000)
    for i in range(3):
        buf.add_trajectories([{"obs": np.full((100, 10, 3), i + 1, np.float32)}])
    buf.flush()
    segment.Segment.write_rows = lambda *a, **k: os._exit(9)
    buf.add_trajectories([{"obs": np.full((100, 10, 3), 9, np.float32)}])
    buf.flush()


def test_live_rows_never_name_rows_a_killed_commit_did_not_publish(tmp_path):
    """live_rows follows the commit record, never the commit in flight: after a writer
    is killed mid-commit, plain zarr's ``arr[slice(*live_rows)]`` holds committed rows."""
    from conftest import processes

    path = str(tmp_path / "b")
    child = processes().Process(target=_die_writing_rows, args=(path,))
    child.start()
    child.join(60)
    assert child.exitcode == 9
    commit = json.loads((tmp_path / "b/segments/default/zreplay/commit.json").read_text())
    assert (commit["low_row"], commit["n_rows"]) == (0, 3000)
    seg = zarr.open_group(path, mode="r")["segments/default"]
    low, n = seg.attrs["live_rows"]
    assert [low, n] == [0, 3000]
    assert set(np.unique(seg["data/obs"][low:n])) == {1.0, 2.0, 3.0}


def test_a_killed_clear_of_nested_arrays_leaves_no_shard_files_behind(tmp_path, monkeypatch):
    """clear() of a format-4 segment killed after an array's zarr.json went but before
    its c/ did: the next writer makes that array again (flat) and the old nested shard
    files, all below the commit's reclaimed_below, are deleted when it opens."""
    from zreplay.store.root import BufferRoot

    with tarfile.open(DATA / "format4-buffer.tar.gz") as t:
        t.extractall(tmp_path, filter="data")
    path = tmp_path / "fmt4"
    zreplay.upgrade(path)
    array = path / "segments" / "a" / "data" / "actions"

    def killed(self, writer_id):
        (array / "zarr.json").unlink()
        raise KeyboardInterrupt  # stands for the kill: the rest of the tree stays

    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), writer_id="a")
    monkeypatch.setattr(BufferRoot, "remove_segment_data", killed)
    with pytest.raises(KeyboardInterrupt):
        buf.clear()
    monkeypatch.undo()
    buf.close()
    assert _nested_and_flat(array)[0]  # c/<s>/0 files left
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), writer_id="a")
    buf.add_trajectories([make_traj(80)])
    buf.flush()
    assert not (array / "c").exists()
    check_rows(buf.sample(32))
    buf.close()
    assert zreplay.verify(path).ok


def test_plain_zarr_reads_every_trajectory(written):
    """The recipe of FORMAT.md, with zarr and json only."""
    path, trajs = written
    root = zarr.open_group(path, mode="r")
    schema = root.attrs["zreplay"]["schema"]
    seg = root["segments/default"]
    commit = json.loads(open(f"{path}/segments/default/zreplay/commit.json").read())
    off = seg["offsets"][: commit["n_traj"] + 1]
    T_col, B_col = seg["traj/T"][: commit["n_traj"]], seg["traj/B"][: commit["n_traj"]]
    for i in range(commit["low_traj"], commit["n_traj"]):
        T, B = int(T_col[i]), int(B_col[i])
        got = {}
        for key in schema:
            rows = seg[f"data/{key}"][off[i] : off[i + 1]]  # env-major: [B*T, ...]
            got[key] = rows.reshape(B, T, *rows.shape[1:]).swapaxes(0, 1)
        traj_equal(zreplay.schema.unflatten(got), trajs[i])
    assert seg["traj/trajectory_id"][: commit["n_traj"]].tolist() == [0, 1, 2, 3]
    wid = bytes(seg["traj/model_weights_id"][0]).rstrip(b"\0").decode()
    assert wid == zreplay.open(path).trajectory(0)["model_weights_id"]


def rollout_chunks(n_chunks, T, B, seed=0, p_end=0.08):
    """Consecutive chunks of B envs; obs code = env * 1e6 + global step of that env."""
    rng = np.random.default_rng(seed)
    chunks = []
    for c in range(n_chunks):
        t = np.arange(c * T, (c + 1) * T)[:, None]
        code = (np.arange(B)[None, :] * 1_000_000 + t).astype(np.float64)
        term = rng.random((T, B)) < p_end / 2
        trunc = (rng.random((T, B)) < p_end / 2) & ~term
        chunks.append(
            {
                "curr_obs": {"state": code[..., None]},
                "actions": code[..., None].astype(np.float32),
                "rewards": rng.standard_normal((T, B, 1)).astype(np.float32),
                "terminations": term[..., None],
                "truncations": trunc[..., None],
            }
        )
    return chunks


def test_plain_zarr_reads_every_episode(tmp_path):
    """FORMAT.md's plain-zarr episode recipe gives the same episodes as the view."""
    import json

    import zarr

    path = str(tmp_path / "b")
    buf = builders.writer(path)
    buf.add([Prepared(flatten(c), 8, 3, continues=True) for c in rollout_chunks(5, 8, 3, seed=4)])
    buf.close()
    root = zarr.open_group(path, mode="r")
    schema = root.attrs["zreplay"]["schema"]
    got = []
    for wid in root["segments"].group_keys():
        seg = root["segments"][wid]
        commit = json.load(open(f"{path}/segments/{wid}/zreplay/commit.json"))
        k0, k1 = commit["low_piece"], commit["n_pieces"]
        ep = {
            c: seg[f"episodes/{c}"][k0:k1]
            for c in ("start", "length", "episode", "step", "terminated", "truncated")
        }
        order = np.lexsort((ep["step"], ep["episode"]))
        for e in np.unique(ep["episode"]):
            pieces = order[ep["episode"][order] == e]
            rows = np.concatenate(
                [np.arange(ep["start"][p], ep["start"][p] + ep["length"][p]) for p in pieces]
            )
            episode = {key: seg[f"data/{key}"].get_orthogonal_selection((rows,)) for key in schema}
            got.append((tuple(episode["curr_obs/state"][:, 0]), bool(ep["terminated"][pieces[-1]])))
    view = zreplay.open(path)
    tab = view.episode_table()
    want = [
        (tuple(view.episode(e)["curr_obs"]["state"][:, 0]), bool(tab["terminated"][e]))
        for e in range(view.num_episodes)
    ]
    assert sorted(got) == sorted(want) and len(got) > 3
