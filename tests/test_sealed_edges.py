"""Edges an adversarial pass found where the offline part meets other facades: a TorchRL
ring refuses a buffer with a sealed part (it would have shown the offline rows as its
own slots), and the LeRobot export refuses frames too small for the AV1 encoder (which
kills the process) before anything is written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import zreplay
from zreplay.errors import CorruptBufferError, FormatError, SchemaError

tensordict = pytest.importorskip("tensordict")
pytest.importorskip("torchrl")


def test_a_torchrl_storage_refuses_a_buffer_with_a_sealed_part(tmp_path):
    from tensordict import TensorDict

    from zreplay.torchrl import ZarrStorage

    p = tmp_path / "b"
    st = ZarrStorage(8, path=p, writer_id="a")
    st.set(torch.arange(6), TensorDict({"x": torch.arange(6.0) + 1000}, [6]))
    st.close()
    zreplay.seal(p, "a")
    with pytest.raises(FormatError, match="sealed offline segments .*6 rows"):
        ZarrStorage(8, path=p, writer_id="b")
    # nothing held: a second try says the same, and the sealed rows are intact
    with pytest.raises(FormatError, match="sealed offline"):
        ZarrStorage(8, path=p, writer_id="b")
    assert zreplay.open(p).num_rows == 6


@pytest.mark.parametrize("side", [(16, 16), (64, 16)])
def test_video_export_refuses_frames_too_small_for_av1(tmp_path, side):
    b = zreplay.ReplayBuffer(1000, path=tmp_path / "e")
    for _ in range(2):
        b.write_episode(
            {"cam": np.zeros((5, *side, 3), np.uint8), "action": np.zeros((5, 2), np.float32)}
        )
    b.close()
    with pytest.raises(SchemaError, match="too small for the AV1"):
        zreplay.export_lerobot(tmp_path / "e", tmp_path / "out", fps=10)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


def test_a_writer_refuses_a_segment_whose_commit_it_cannot_read(tmp_path):
    """A damaged commit (of what may be the sealed offline part) is refused by a writer
    of another segment as a view refuses it, rather than sampling online rows only
    (tests/test_offline_edges.py has every kind of damage)."""
    p = tmp_path / "b"
    a = zreplay.ReplayBuffer(100, path=p, writer_id="offline")
    a.write_episode({"x": np.arange(5, dtype=np.float32)})
    a.close()
    zreplay.seal(p, "offline")
    (p / "segments" / "offline" / "zreplay" / "commit.json").write_text("{not json")
    with pytest.raises(CorruptBufferError, match="segment 'offline' .*sealed offline part"):
        zreplay.ReplayBuffer(100, path=p, writer_id="online")
