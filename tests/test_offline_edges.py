"""The offline part's edges: a damaged sealed segment is refused alike by a view and by a
writer of another segment (never left out of samples quietly), and ``zreplay verify``
reports it; a segment not yet committed, or an import still building, is no damage."""

from __future__ import annotations

import json

import numpy as np
import pytest

import zreplay
from zreplay.errors import CorruptBufferError


def sealed_buffer(p, T=5):
    a = zreplay.ReplayBuffer(100, path=p, writer_id="offline")
    a.write_episode({"x": np.arange(T, dtype=np.float32)})
    a.close()
    zreplay.seal(p, "offline")


def commit_file(p):
    return p / "segments" / "offline" / "zreplay" / "commit.json"


# (name, how the record is damaged, the field the error names)
DAMAGE = [
    ("unreadable", lambda d: "{not json", "unreadable"),
    ("low_row hides every row", lambda d: {**d, "low_row": 2**62, "n_rows": 2**62}, "rows"),
    ("low_row past n_rows", lambda d: {**d, "low_row": 10**12}, "inconsistent"),
    ("gen out of range", lambda d: {**d, "gen": -1}, "gen=-1"),
    ("gen not an int", lambda d: {**d, "gen": "x"}, "'gen'"),
    ("another segment's record", lambda d: {**d, "writer_id": "other"}, "'other'"),
    ("low_traj hides every trajectory", lambda d: {**d, "low_traj": d["n_traj"]}, "starts at row"),
    ("huge n_rows", lambda d: {**d, "n_rows": 2**62}, "needs"),
    ("view_rows", lambda d: {**d, "sampler": {**d["sampler"], "view_rows": -3}}, "view_rows"),
]


@pytest.mark.parametrize("damage", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_a_damaged_sealed_segment_is_refused_alike_by_writer_and_view(tmp_path, damage):
    _, how, field = damage
    p = tmp_path / "b"
    sealed_buffer(p)
    record = json.loads(commit_file(p).read_text())
    out = how(record)
    commit_file(p).write_text(out if isinstance(out, str) else json.dumps(out))
    before = sorted(x.name for x in (p / "segments").iterdir())
    errors = []
    for make in (
        lambda: zreplay.ReplayBuffer(100, path=p, writer_id="online"),
        lambda: zreplay.open(p),
    ):
        with pytest.raises(CorruptBufferError) as e:
            make()
        errors.append(str(e.value))
    for msg in errors:
        assert "segment 'offline'" in msg and field in msg
        assert f"zreplay verify {p}" in msg and "re-import" in msg
    # one validation: the writer says what the view says
    assert errors[0] == errors[1]
    # refused before the writer made anything (no segment "online" beside it)
    assert sorted(x.name for x in (p / "segments").iterdir()) == before
    assert not zreplay.verify(p).ok


def test_a_sealed_segment_emptied_before_sealing_shows_no_rows_and_is_no_damage(tmp_path):
    p = tmp_path / "b"
    a = zreplay.ReplayBuffer(100, path=p, writer_id="offline")
    a.write_episode({"x": np.arange(5, dtype=np.float32)})
    a.clear()
    a.close()
    zreplay.seal(p, "offline")
    b = zreplay.ReplayBuffer(100, path=p, writer_id="online")
    b.write_episode({"x": np.arange(3, dtype=np.float32)})
    assert len(b) == 3
    b.close()
    assert zreplay.open(p).num_rows == 3
    assert zreplay.verify(p).ok


def test_a_segment_before_its_first_commit_is_no_damage(tmp_path):
    """A writer that has joined but not committed yet leaves a segment without a commit
    record: every reader skips it, as before."""
    p = tmp_path / "b"
    sealed_buffer(p)
    joined = p / "segments" / "late"
    joined.mkdir()
    (joined / "zarr.json").write_text((p / "segments" / "offline" / "zarr.json").read_text())
    b = zreplay.ReplayBuffer(100, path=p, writer_id="online")
    b.close()
    assert zreplay.open(p).num_rows == 5
    assert zreplay.verify(p).ok


def test_a_buffer_being_replaced_by_an_import_stays_whole_for_its_readers(tmp_path):
    """An import builds aside: while one replaces a buffer (overwrite=True), a writer and a
    view opened on it see the old buffer whole, never damage, and afterwards the new."""
    from test_minari import write_minari

    p = tmp_path / "b"
    sealed_buffer(p)
    write_minari(tmp_path / "ds", [3, 2, 4])
    seen = []

    def mid_import(k):
        if not seen:
            w = zreplay.ReplayBuffer(100, path=p, writer_id="online")
            seen.append((zreplay.open(p).num_rows, len(w)))
            w.close()

    zreplay.import_minari(tmp_path / "ds", p, overwrite=True, progress=mid_import)
    assert seen == [(5, 5)]
    assert zreplay.open(p).num_rows == 9
    assert zreplay.verify(p).ok
