"""The RAM ring: env-major writes that wrap, gathers, growth, against a flat reference."""

from __future__ import annotations

import builders
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zreplay.engine.ramtier import RamTier
from zreplay.schema import Schema


@settings(max_examples=100, deadline=None)
@given(
    st.integers(4, 40),
    st.lists(
        st.tuples(st.integers(1, 5), st.integers(1, 4), st.booleans()), min_size=1, max_size=30
    ),
)
def test_ring_matches_reference(capacity, ops):
    schema = Schema.infer(
        {
            "x": np.zeros((1, 1, 2), np.int64),
            "img": np.zeros((1, 1, 2, 2), np.uint8),
            "big": np.zeros((1, 1, 300), np.float32),  # > 1 KiB rows: the plain strided copy
        }
    )
    tier = RamTier(schema, capacity)
    ref = {"x": [], "img": [], "big": []}
    row = 0
    for T, B, grow in ops:
        if grow or 2 * T * B > tier.capacity:
            tier = tier.resized(max(tier.capacity, 2 * T * B) + 3)
        x = np.arange(T * B * 2, dtype=np.int64).reshape(T, B, 2) + 1000 * row
        img = (x[..., :1, None] % 251).astype(np.uint8).repeat(2, -2).repeat(2, -1)
        # A non-contiguous source (every other element of a wider array).
        big = np.repeat(x[..., :1].astype(np.float32), 600, axis=-1)[..., ::2]
        assert tier.reserve(T * B) == row
        tier.write_trajectory(row, {"x": x, "img": img, "big": big}, T, B)
        ref["big"].append(np.swapaxes(big, 0, 1).reshape(T * B, 300))
        ref["x"].append(np.swapaxes(x, 0, 1).reshape(T * B, 2))
        ref["img"].append(np.swapaxes(img, 0, 1).reshape(T * B, 2, 2))
        row += T * B
        assert tier.hi == row and tier.lo >= row - tier.capacity
    flat = {k: np.concatenate(v) for k, v in ref.items()}
    rows = np.arange(tier.lo, tier.hi)
    for k in flat:
        np.testing.assert_array_equal(tier.gather(k, tier.slots(rows)), flat[k][rows])
        got = np.concatenate([p for _, p in tier.read_range(k, tier.lo, tier.hi)])
        np.testing.assert_array_equal(got, flat[k][tier.lo : tier.hi])


def test_a_ram_tier_turned_off_reads_committed_rows_from_disk(tmp_path):
    core = builders.writer(tmp_path / "b", ram_trajectories=0)
    for tid in range(4):
        builders.add(core, tid)

    def whole(batch):  # every row's keys come from one (trajectory, lane, step)
        assert np.all(batch["obs"] == batch["reward"][:, None])
        return set(builders.tids(batch["obs"]))

    assert whole(core.sample(64)) <= set(range(4))  # uncommitted rows: the staging tier
    core.flush()
    assert core.engine.stats()["rows_in_ram"] == 0
    assert whole(core.sample(256)) == set(range(4))  # committed rows: read from disk
    core.close()
