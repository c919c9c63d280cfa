"""stable-worldmodel's ``ReplayBuffer[i]`` takes an integer index, never a float or a bool.

stable-worldmodel 0.1.1's own buffer annotates ``idx: int`` and would truncate ``4.5`` to
clip 4 (``True`` to clip 1) without saying so; zreplay's refuses them as every other
index it takes (``zreplay.numbers.as_int``), with a ``TypeError`` naming the index."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import zreplay


@pytest.fixture
def rb(tmp_path):
    b = zreplay.ReplayBuffer(100, path=tmp_path / "rb", seed=0)
    t = np.arange(10)
    b.write_episode({"action": t[:, None].astype(np.float32), "terminated": t == 9})
    yield b
    b.close()


@pytest.mark.parametrize(
    ("idx", "named"),
    [(4.5, "float 4.5"), (True, "bool True"), (np.float64(2.0), "float64"), (np.bool_(1), "bool")],
)
def test_a_float_or_bool_index_is_refused(rb, idx, named):
    with pytest.raises(TypeError, match=f"index must be an integer, got {named}"):
        rb[idx]


def test_integer_indices_still_read_their_clip(rb):
    for idx in (4, np.int64(4), np.int32(4), torch.tensor(4), -6):
        assert rb[idx]["action"].ravel().tolist() == [4.0]
    with pytest.raises(IndexError, match="^10$"):  # stable-worldmodel's own message
        rb[np.int64(10)]
