"""Two ``zreplay upgrade`` runs of one buffer at once: the one that finds the segment
locks taken says another upgrade (or a writer) holds them, that nothing changed, and to
run it again once that is done; run again, it finds the buffer current."""

from __future__ import annotations

import tarfile
import time
from pathlib import Path

import pytest
from conftest import processes

import zreplay
from zreplay.cli import main as cli
from zreplay.errors import WriterLockedError

DATA = Path(__file__).parent / "data"
HELD = "held by pid .* another `zreplay upgrade` of it, or a writer. Nothing was changed"


def _upgrade_paused(path: str, ready: str, go: str) -> int | None:
    """An upgrade that stops with every lock held (before it builds the new tree) until
    the file ``go`` exists, having made ``ready``."""
    import zreplay.store.upgrade as upgrade_module

    real = upgrade_module._build

    def paused(*args, **kw):
        Path(ready).touch()
        deadline = time.monotonic() + 60
        while not Path(go).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return real(*args, **kw)

    upgrade_module._build = paused
    return zreplay.upgrade(path)


def test_the_second_of_two_upgrades_at_once_says_another_holds_it(tmp_path, capsys):
    with tarfile.open(DATA / "format4-buffer.tar.gz") as t:
        t.extractall(tmp_path, filter="data")
    path, ready, go = tmp_path / "fmt4", tmp_path / "ready", tmp_path / "go"
    ctx = processes()
    with ctx.Pool(1) as pool:
        first = pool.apply_async(_upgrade_paused, (str(path), str(ready), str(go)))
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and not first.ready(), "the first never paused"
            time.sleep(0.01)
        try:
            with pytest.raises(WriterLockedError, match=HELD) as e:
                zreplay.upgrade(path)
            assert "run the upgrade again" in str(e.value) and "being written" not in str(e.value)
            assert cli(["upgrade", str(path)]) == 1
            err = capsys.readouterr().err
            assert "another `zreplay upgrade` of it" in err and "run the upgrade again" in err
        finally:
            go.touch()
        assert first.get(timeout=60) == 4
    assert zreplay.upgrade(path) is None  # run again: current, nothing to do
    assert zreplay.verify(path).ok
