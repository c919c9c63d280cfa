"""A ``ZarrStorage`` read racing ``empty()`` (or a load) on another thread: a legal race,
so it reads consistently or says the storage was emptied, in slots, never naming the
rows underneath and never as damage."""

from __future__ import annotations

import threading
import time

import pytest
import torch

torchrl = pytest.importorskip("torchrl")

from tensordict import TensorDict  # noqa: E402
from torchrl.data import ReplayBuffer  # noqa: E402

from zreplay.torchrl import ZarrStorage  # noqa: E402


def batch(start: int, n: int) -> TensorDict:
    return TensorDict({"g": torch.arange(start, start + n, dtype=torch.float32)}, [n])


@pytest.fixture
def rb(tmp_path):
    st = ZarrStorage(50, path=tmp_path / "s")
    b = ReplayBuffer(storage=st, batch_size=8)
    b.extend(batch(0, 40))
    yield b
    st.close()


def empty_midway(rb, monkeypatch, refill: bool = False):
    """Make the storage's next row read run ``rb.empty()`` (then, with ``refill``, an
    extend) first: another thread's empty, landed after the slots were chosen."""
    core = rb._storage.core
    real = core.read_global_rows  # a writing storage reads its ring's global rows
    fired = []

    def rows(*a, **kw):
        if not fired:
            fired.append(True)
            rb.empty()
            if refill:
                rb.extend(batch(1000, 40))
        return real(*a, **kw)

    monkeypatch.setattr(core, "read_global_rows", rows)
    return fired


@pytest.mark.parametrize("refill", [False, True])
@pytest.mark.parametrize("read", ["get", "sample"])
def test_a_read_overlapping_empty_says_so_in_slots(rb, monkeypatch, read, refill):
    fired = empty_midway(rb, monkeypatch, refill)
    with pytest.raises(IndexError, match="was emptied or loaded .* sample or index it again") as e:
        rb._storage.get(torch.tensor([1, 30])) if read == "get" else rb.sample()
    assert fired and "row positions" not in str(e.value)
    assert len(rb) == (40 if refill else 0)
    if refill:  # the next read is of the new contents, whole
        assert sorted(rb._storage.get(torch.arange(40))["g"].tolist()) == list(range(1000, 1040))


def test_a_read_after_the_empty_is_torchrls_own_error(rb):
    rb.empty()
    with pytest.raises(IndexError, match="out of bounds for dimension 0 with size 0"):
        rb._storage.get(torch.tensor([1]))


def test_reads_racing_empty_on_a_thread_are_never_about_rows(rb):
    stop, errors = threading.Event(), []

    def emptier():
        try:
            for i in range(10):
                rb.empty()
                rb.extend(batch(100 * i, 40))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            stop.set()

    t = threading.Thread(target=emptier)
    t.start()
    while not stop.is_set():
        try:
            g = rb.sample()["g"]
            assert ((g // 100) == (g[0] // 100)).all()  # one contents' rows, never a mix
            time.sleep(0.001)  # let the emptier run (the GIL): each of its turns is a race
        except RuntimeError as e:  # TorchRL's sampler found it empty
            assert "Cannot sample from an empty storage" in str(e)
        except IndexError as e:
            msg = str(e)
            assert "row positions" not in msg
            assert "was emptied or loaded" in msg or "out of bounds for dimension 0" in msg
    t.join()
    assert not errors
    assert len(rb) == 40
