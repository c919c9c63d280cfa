"""Damaged stores: checksummed chunks, verify(), truncated commit records."""

from __future__ import annotations

import json
import re
import shutil
from contextlib import closing
from pathlib import Path

import builders
import numpy as np
import pytest
import zarr
from conftest import check_rows, shard_files, tree_state

import zreplay
from zreplay import CorruptBufferError


@pytest.fixture
def written(bufpath):
    with closing(builders.writer(bufpath)) as buf:
        builders.add_full(buf, range(4))
    return Path(bufpath)


def shard_file(root: Path, key: str) -> Path:
    return shard_files(root, key)[0]


def test_healthy_buffer_verifies(written):
    report = zreplay.verify(written)
    assert report.ok, str(report)
    assert report.trajectories == 4 and report.rows_checked == 4 * 18  # rows, not x keys
    assert "72 rows checked" in str(report)


def test_flipped_byte_is_an_error_naming_the_key_never_wrong_data(written):
    f = shard_file(written, "rewards")
    data = bytearray(f.read_bytes())
    data[len(data) // 3] ^= 0x40  # inside a compressed chunk, not the shard index
    f.write_bytes(bytes(data))
    report = zreplay.verify(written)
    assert not report.ok and len(report.problems) == 1
    assert "key 'rewards'" in report.problems[0] and "rows [0, " in report.problems[0]
    with closing(builders.writer(written, ram_trajectories=0)) as buf:
        with pytest.raises(CorruptBufferError, match="key 'rewards'"):
            for _ in range(20):
                check_rows(builders.nested(buf.sample(64)))
    with pytest.raises(CorruptBufferError, match="rewards"):
        zreplay.open(written).trajectory(0)


def test_truncated_shard_is_reported(written):
    f = shard_file(written, "curr_obs/main_images")
    f.write_bytes(f.read_bytes()[:100])
    report = zreplay.verify(written)
    assert any("curr_obs/main_images" in p for p in report.problems)


def test_truncated_commit_record(written):
    commit = written / "segments" / "default" / "zreplay" / "commit.json"
    commit.write_text(commit.read_text()[:40])
    report = zreplay.verify(written)
    assert not report.ok and "commit record is unreadable" in report.problems[0]
    with pytest.raises(CorruptBufferError, match="commit record is unreadable"):
        builders.writer(written)
    with pytest.raises(CorruptBufferError):
        zreplay.open(written)


def test_verify_of_a_non_buffer(tmp_path):
    report = zreplay.verify(tmp_path)
    assert not report.ok and "not a zreplay buffer" in report.problems[0]


# -- every kind of damage: a specific error from readers and writers, reported by verify --

SEG = "segments/default/"


def _write(rel: str, data: bytes):
    return lambda root: (root / rel).write_bytes(data)


def _truncate(rel: str, keep: int):
    return lambda root: (root / rel).write_bytes((root / rel).read_bytes()[:keep])


def _remove(rel: str):
    def damage(root):
        p = root / rel
        shutil.rmtree(p) if p.is_dir() else p.unlink()

    return damage


def _flip(rel: str):
    def damage(root):
        data = bytearray((root / rel).read_bytes())
        data[len(data) // 3] ^= 0x40  # inside a compressed chunk, not the shard index
        (root / rel).write_bytes(bytes(data))

    return damage


def _commit_with(**fields):
    def damage(root):
        c = json.loads((root / SEG / "zreplay" / "commit.json").read_text())
        (root / SEG / "zreplay" / "commit.json").write_text(json.dumps({**c, **fields}))

    return damage


def _array_meta(rel: str, **fields):
    def damage(root):
        meta = json.loads((root / rel / "zarr.json").read_text())
        (root / rel / "zarr.json").write_text(json.dumps({**meta, **fields}))

    return damage


def _root_schema(key: str, **fields):
    def damage(root):
        meta = json.loads((root / "zarr.json").read_text())
        spec = meta["attributes"]["zreplay"]["schema"][key]
        spec.update(fields)
        (root / "zarr.json").write_text(json.dumps(meta))

    return damage


def _index_edit(rel: str, edit):
    """Rewrite an index array through zarr (valid chunks and checksums, wrong values)."""

    def damage(root):
        arr = zarr.open_array(str(root / rel), mode="r+")
        arr[:] = edit(arr[:])

    return damage


REWARDS_SHARD = SEG + "data/rewards/c.0.0"
DAMAGE = {  # name: (damage, what the error says)
    "commit.json binary garbage": (_write(SEG + "zreplay/commit.json", b"\xff\xfe\x00\x13junk"), "commit record is unreadable"),
    "commit.json empty": (_write(SEG + "zreplay/commit.json", b""), "commit record is unreadable"),
    "commit.json a list": (_write(SEG + "zreplay/commit.json", b"[1, 2]"), "commit record is unreadable"),
    "commit.json truncated": (_truncate(SEG + "zreplay/commit.json", 40), "commit record is unreadable"),
    "commit.json unknown field": (_commit_with(evil=1), "unexpected keyword argument 'evil'"),
    "commit.json n_rows a string": (_commit_with(n_rows="72"), "field 'n_rows' is '72'"),
    "commit.json n_traj null": (_commit_with(n_traj=None), "field 'n_traj' is None"),
    "commit.json n_rows negative": (_commit_with(n_rows=-1), "inconsistent"),
    "commit.json more rows than written": (_commit_with(n_rows=10**12), "needs 1000000000000"),
    "commit.json more trajectories than indexed": (_commit_with(n_traj=10**6), "needs 1000001"),
    "root zarr.json truncated": (_truncate("zarr.json", 50), "zarr.json is not valid JSON"),
    "array zarr.json truncated": (_truncate(SEG + "data/actions/zarr.json", 50), "cannot open array"),
    "offsets zarr.json truncated": (_truncate(SEG + "offsets/zarr.json", 50), "cannot open array"),
    "data array missing": (_remove(SEG + "data/rewards"), "data/rewards"),
    "offsets array missing": (_remove(SEG + "offsets"), "offsets"),
    "offsets chunk truncated": (_truncate(SEG + "offsets/c/0", 5), "index cannot be read"),
    "data shard missing": (_remove(REWARDS_SHARD), "key 'rewards', rows [0, 72)"),
    "data shard truncated": (_truncate(REWARDS_SHARD, 100), "key 'rewards', rows [0, 72)"),
    "data chunk byte flipped": (_flip(REWARDS_SHARD), "key 'rewards', rows [0, 72)"),
    # issue 13, defect 7: index chunks are checksummed, array metadata cross-checked
    "offsets chunk byte flipped": (_flip(SEG + "offsets/c/0"), "index cannot be read"),
    "trajectory ids chunk byte flipped": (_flip(SEG + "traj/trajectory_id/c/0"), "index cannot be read"),
    "terminated flags chunk byte flipped": (_flip(SEG + "episodes/terminated/c/0"), "index cannot be read"),
    "trajectory ids repeat": (_index_edit(SEG + "traj/trajectory_id", lambda a: np.where(np.arange(len(a)) == 2, a[1], a)), "trajectory ids repeat"),
    "data array dtype edited": (_array_meta(SEG + "data/rewards", data_type="int32"), "but the root records float32"),
    "offsets dtype edited": (_array_meta(SEG + "offsets", data_type="uint64"), "but the root records int64"),
    "data chunk keys a list": (_array_meta(SEG + "data/rewards", chunk_key_encoding=["default"]), "cannot open array"),
    "data chunk key configuration a string": (_array_meta(SEG + "data/rewards", chunk_key_encoding={"name": "default", "configuration": "."}), "cannot open array"),
    "data chunk key separator unknown": (_array_meta(SEG + "data/rewards", chunk_key_encoding={"name": "default", "configuration": {"separator": "-"}}), "cannot open array"),
    # defect 9: recorded shapes are bounded before anything is allocated
    "root schema row shape huge": (_root_schema("rewards", row_shape=[2**20, 2**20]), "recorded schema or layout is invalid"),
    "root schema dtype unknown": (_root_schema("rewards", dtype="<c16"), "recorded schema or layout is invalid"),
}  # fmt: skip


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("pristine") / "buf"
    with closing(builders.writer(path)) as buf:
        builders.add_full(buf, range(4))  # 72 rows
    return path


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damage_is_a_specific_error_everywhere_and_reported(pristine, tmp_path, case):
    damage, says = DAMAGE[case]
    root = tmp_path / "buf"
    shutil.copytree(pristine, root)
    (tmp_path / "neighbour.txt").write_text("not ours")
    damage(root)
    outside = tree_state(tmp_path, skip=root)
    before = tree_state(root)

    def read_all():
        view = zreplay.open(root)
        check_rows(view.rows(np.arange(view.num_rows)))

    with pytest.raises(CorruptBufferError, match=re.escape(says)):
        read_all()
    assert tree_state(root) == before  # readers change nothing
    with pytest.raises(CorruptBufferError, match=re.escape(says)):
        with closing(builders.writer(root)) as buf:
            check_rows(builders.nested(buf.sample(500)))
    assert not (root / SEG / "zreplay" / "writer.lock").exists()  # the refused writer let go
    report = zreplay.verify(root)
    assert not report.ok and any(says in p for p in report.problems), str(report)
    assert tree_state(tmp_path, skip=root) == outside


@pytest.mark.parametrize(
    "rel", ["offsets/c/0", "traj/trajectory_id/c/0", "episodes/terminated/c/0"]
)
def test_every_bit_flip_in_an_index_chunk_is_caught(pristine, tmp_path, rel):
    """Issue 13, defect 7: index chunks had no checksum; some flips decoded to other ids,
    merged episodes or cleared a terminated flag with verify OK."""
    root = tmp_path / "buf"
    shutil.copytree(pristine, root)
    chunk = root / SEG / rel
    data = chunk.read_bytes()
    for i in range(len(data)):
        for bit in (0x01, 0x10, 0x80):
            damaged = bytearray(data)
            damaged[i] ^= bit
            chunk.write_bytes(bytes(damaged))
            with pytest.raises(CorruptBufferError, match="index cannot be read"):
                zreplay.open(root)
    chunk.write_bytes(data)
    assert zreplay.verify(root).ok


OPEN_ALL = """
import json, sys, zreplay
sys.path.insert(0, sys.argv[2])
import builders
out = {}
for name, fn in [
    ("view", lambda: zreplay.open(sys.argv[1]).sample(8)),
    ("writer", lambda: builders.writer(sys.argv[1]).sample(8)),
]:
    try:
        fn()
        out[name] = "opened"
    except zreplay.CorruptBufferError as e:
        out[name] = str(e)
report = zreplay.verify(sys.argv[1])
out["verify"] = report.problems
print(json.dumps(out))
"""


def _huge_index(root):
    for rel in ["offsets", *(f"traj/{c}" for c in ("trajectory_id", "T", "B", "max_episode_length", "model_weights_id", "piece_end")), *(f"episodes/{c}" for c in ("start", "length", "episode", "step", "terminated", "truncated"))]:  # fmt: skip
        _array_meta(
            SEG + rel,
            shape=[10**15, *json.loads((root / SEG / rel / "zarr.json").read_text())["shape"][1:]],
        )(root)
    _commit_with(n_traj=10**15 - 1, n_pieces=10**15 - 1)(root)


def _huge_rows(root):
    for meta_file in (root / SEG / "data").rglob("zarr.json"):
        meta = json.loads(meta_file.read_text())
        if meta["node_type"] == "array":
            meta_file.write_text(json.dumps({**meta, "shape": [10**15, *meta["shape"][1:]]}))
    _commit_with(n_rows=10**15)(root)


@pytest.mark.parametrize("damage", [_huge_index, _huge_rows], ids=["index", "rows"])
def test_absurd_recorded_sizes_are_errors_not_aborts(pristine, tmp_path, damage):
    """Issue 13, defect 9: array shapes of 1e15 with a matching commit count killed the
    view, the writer and verify with an uncatchable std::bad_alloc."""
    import subprocess
    import sys

    root = tmp_path / "buf"
    shutil.copytree(pristine, root)
    damage(root)
    done = subprocess.run(
        [sys.executable, "-c", OPEN_ALL, str(root), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["view"] != "opened" and out["writer"] != "opened", out
    assert out["verify"], out


# -- what damage can make an index or a commit record say (an adversarial pass) --------


def _edit_commit(root: Path, **fields) -> None:
    f = root / "segments" / "default" / "zreplay" / "commit.json"
    c = json.loads(f.read_text())
    c.update(fields)
    f.write_text(json.dumps(c))


def _edit_index(root: Path, name: str, at: int, value) -> None:
    import zarr

    a = zarr.open_array(root / "segments" / "default" / name, mode="r+")
    a[at] = value


@pytest.mark.parametrize(
    "damage",
    [
        "reclaimed_below past the visible rows",  # the next writer deleted every shard
        "next trajectory id rewound",  # ids were handed out again
        "next episode id rewound",  # episodes of different trajectories merged
        "low_traj without low_row",  # a trajectory silently hidden
        "another segment's record",
        "a trajectory of other than T * B rows",  # a numpy reshape error in readers
        "an episode piece outside its trajectory",  # episode() returned garbage
        "a repeated trajectory id",
    ],
)
def test_damage_the_index_or_commit_can_show_is_reported_not_acted_on(written, damage):
    if damage == "reclaimed_below past the visible rows":
        _edit_commit(written, reclaimed_below=10**9)
    elif damage == "next trajectory id rewound":
        _edit_commit(written, next_trajectory_id=1)
    elif damage == "next episode id rewound":
        _edit_commit(written, next_episode=1)
    elif damage == "low_traj without low_row":
        _edit_commit(written, low_traj=1)
    elif damage == "another segment's record":
        _edit_commit(written, writer_id="other")
    elif damage == "a trajectory of other than T * B rows":
        _edit_index(written, "traj/T", 1, 11)
    elif damage == "an episode piece outside its trajectory":
        _edit_index(written, "episodes/start", 2, 1000)
    else:
        _edit_index(written, "traj/trajectory_id", 2, 1)

    def files(root):  # data, indexes and the commit record; locks may come and go
        return {
            k: v
            for k, v in tree_state(root).items()
            if "lock" not in k and "/" in k and not k.endswith("/zreplay")
        }

    before = files(written)
    report = zreplay.verify(written)
    assert not report.ok, f"{damage}: verify said OK"
    with pytest.raises(CorruptBufferError):
        builders.writer(written)
    with pytest.raises(CorruptBufferError):
        zreplay.open(written)
    assert files(written) == before  # nothing acted on it


def test_rows_without_a_commit_record_are_a_warning(written):
    (written / "segments" / "default" / "zreplay" / "commit.json").unlink()
    report = zreplay.verify(written)
    assert report.ok and any("no commit record" in w for w in report.warnings), report


def test_verify_beside_a_live_writer_reports_no_damage(tmp_path):
    """Rows evicted (and their shards deleted) or priorities saved again while verify
    read them were reported as damage (about 2% of runs beside a busy writer)."""
    import threading

    from zreplay.samplers import Prioritized

    path = tmp_path / "b"
    lay = {k: {"chunk_rows": 4, "shard_rows": 8} for k in ("rewards",)}
    buf = builders.writer(path, capacity=60, layout=lay, sampler=Prioritized(save_every_s=0.0))
    builders.add_full(buf, [0])
    buf.flush()
    stop = threading.Event()

    def write():
        i = 1
        while not stop.is_set():
            builders.add_full(buf, [i % 50])
            buf.update_priorities(buf.sample(8)["index"], np.full(8, float(i % 7 + 1)))
            buf.flush()
            i += 1

    t = threading.Thread(target=write)
    t.start()
    try:
        reports = [zreplay.verify(path) for _ in range(30)]
    finally:
        stop.set()
        t.join(30)
        buf.close()
    bad = [str(r) for r in reports if not r.ok]
    assert not bad, bad[0]
