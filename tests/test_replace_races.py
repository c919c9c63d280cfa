"""Replacing a buffer's contents (clear, load_checkpoint, a restart with overwrite=True)
while readers read it: a view never pairs rows of the old contents with rows of the new
(its caches are keyed by a contents id, never by trajectory ids, which start again), and
a sample or an open racing the replacement sees the old contents, the new ones or an
empty buffer, never a CorruptBufferError (that is for what ``zreplay.verify`` flags)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import check_rows, make_traj, run_children

import zreplay
from zreplay.errors import CorruptBufferError, EmptyBufferError


def trb(path, opts=None, **kw):
    kw.setdefault("sample_window_size", 0)
    return zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), storage_options=opts, **kw
    )


def _filled(path, first: int, n: int = 4) -> None:
    with trb(path) as buf:
        buf.add_trajectories([make_traj(first + i) for i in range(n)])


def _replace(path, other, how) -> None:
    """Give the buffer at ``path`` other contents (trajectories 50..53) by ``how``."""
    if how == "load_checkpoint":
        with trb(path) as buf:
            buf.load_checkpoint(str(other))
    else:
        with trb(path, overwrite=True) as buf:
            buf.add_trajectories([make_traj(50 + i) for i in range(4)])


@pytest.mark.parametrize("how", ["load_checkpoint", "overwrite"])
def test_a_view_never_pairs_old_cached_columns_with_new_rows(tmp_path, how):
    path, other = tmp_path / "b", tmp_path / "other"
    _filled(path, 0)
    _filled(other, 50)  # other data, same trajectory ids 0..3 and row numbers
    view = zreplay.open(path)
    codes = check_rows(view.sample(256))  # fills the column cache of the small keys
    assert set(codes // 10000) <= {0, 1, 2, 3}
    _replace(path, other, how)
    view.refresh()
    for _ in range(5):
        codes = check_rows(view.sample(256))  # every field of a row from one transition
        assert set(codes // 10000) <= {50, 51, 52, 53}


def _race(stop: threading.Event, fn, errors: list, pause: float = 0.001) -> threading.Thread:
    def run():
        while not stop.is_set():
            time.sleep(pause)  # a training step between samples (the GIL changes hands)
            try:
                fn()
            except EmptyBufferError:
                pass  # the buffer was empty at that instant: a legal answer
            except BaseException as e:  # noqa: BLE001 - collected, the test fails
                errors.append(e)
                return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_sample_racing_clear_in_another_thread_is_never_damage(tmp_path):
    """(Before: CorruptBufferError in 4 of 5 such runs: clear() deleted the files a
    sample was reading from disk.)"""
    buf = trb(tmp_path / "b", enable_cache=False)  # every sample reads from disk
    stop, errors = threading.Event(), []

    def fill(first):
        buf.add_trajectories([make_traj(first + i, T=20, B=4) for i in range(40)])
        buf.flush()

    fill(0)
    t = _race(stop, lambda: check_rows(buf.sample(1024)), errors, pause=0.0)
    deadline, clears = time.monotonic() + 5.0, 0
    while time.monotonic() < deadline and not errors:
        buf.clear()
        fill(100 + 40 * (clears % 20))
        clears += 1
    stop.set()
    t.join(10)
    buf.close()
    assert not errors, errors[0]
    assert clears >= 3


# Each side runs ``seconds``, and on a loaded machine on until it has made the progress the
# test needs (at most LOADED_S): a race test, not a timed one.
LOADED_S = 120.0


def _replacing_writer(path, opts, seconds: float, other) -> int:
    rounds, start = 0, time.monotonic()
    buf = trb(path, opts)
    while (now := time.monotonic() - start) < seconds or (rounds < 3 and now < LOADED_S):
        buf.clear()
        buf.add_trajectories([make_traj(100 + rounds % 20 + i) for i in range(2)])
        buf.flush()
        if other is not None and rounds % 3 == 2:
            buf.load_checkpoint(other)
        rounds += 1
    buf.close()
    return rounds


def _opening_reader(path, opts, seconds: float) -> dict:
    got = {"opens": 0, "samples": 0, "empty": 0}
    start = time.monotonic()
    while (now := time.monotonic() - start) < seconds or (
        (got["opens"] < 3 or got["samples"] < 1) and now < LOADED_S
    ):
        try:
            view = zreplay.open(path, storage_options=opts)
            got["opens"] += 1
            check_rows(view.sample(32))
            got["samples"] += 1
        except EmptyBufferError:
            got["empty"] += 1
        except CorruptBufferError as e:
            raise AssertionError(f"a legal replacement reported as damage: {e}") from e
    return got


def test_views_opened_in_a_loop_racing_clear_and_load_never_see_damage(shared_location, tmp_path):
    path, opts = shared_location
    other = tmp_path / "other"
    _filled(other, 60, n=2)
    with trb(path, opts) as buf:
        buf.add_trajectories([make_traj(i) for i in range(2)])
    seconds = 4.0 if opts is None else 8.0
    rounds, got = run_children(
        [
            (_replacing_writer, (path, opts, seconds, None if opts else str(other))),
            (_opening_reader, (path, opts, seconds)),
        ],
        timeout=180,
    )
    assert rounds >= 2 and got["opens"] >= 3, (rounds, got)  # moto's S3 is slow
    assert got["samples"] >= 1, got


@pytest.mark.parametrize("cache", [True, False], ids=["column cache", "no cache"])
@pytest.mark.parametrize("how", ["load_checkpoint", "overwrite"])
def test_a_view_that_did_not_refresh_never_reads_the_new_files_as_its_rows(tmp_path, how, cache):
    """The replaced segment's files sit at the same row numbers; a view still on the old
    snapshot read them as its rows (with the column cache: old small keys beside new
    images; without: new rows under old trajectory metadata)."""
    path, other = tmp_path / "b", tmp_path / "other"
    _filled(path, 0)
    _filled(other, 50)
    view = zreplay.open(path, column_cache_bytes=None if cache else 0)
    check_rows(view.sample(256))
    _replace(path, other, how)
    old, new = {0, 1, 2, 3}, {50, 51, 52, 53}
    for _ in range(3):  # no refresh(): its snapshot (from RAM), or the new one, never both
        got = set(check_rows(view.sample(256)) // 10000)
        assert got <= old or got <= new, got
    for i in range(view.num_trajectories):
        t = view.trajectory(i)  # metadata and rows of the same trajectory
        assert set(np.unique(t["actions"][..., 0] // 10000)) == {t["max_episode_length"] - 100}


def test_overwrite_removes_the_commits_before_the_rows(tmp_path, monkeypatch):
    """A filesystem may list a directory's data before its commit records (tmpfs did):
    removed in that order, a reader found rows missing under a commit that still named
    them and reported damage.  The commit records go first, so a reader sees the buffer
    go, never damage."""
    path = tmp_path / "b"
    with trb(path) as buf:
        buf.add_trajectories([make_traj(i) for i in range(3)])
    view = zreplay.open(path, column_cache_bytes=0)
    from zreplay.store.backend_local import LocalBackend

    real = LocalBackend.remove_tree
    seen = []

    def data_first(self, loc):
        if str(loc) == str(path):
            commits = list(path.glob("segments/*/zreplay/commit.json"))
            seen.append((commits, (path / "zarr.json").exists()))
            for d in path.glob("segments/*/data"):  # tmpfs's order: the rows first ...
                real(self, d)
            with pytest.raises((EmptyBufferError, zreplay.FormatError)):
                view.sample(16)  # ... a reader in between sees the buffer go
        return real(self, loc)

    monkeypatch.setattr(LocalBackend, "remove_tree", data_first)
    trb(path, overwrite=True).close()
    assert seen == [([], False)]  # no commit record, no root zarr.json left by then


def test_a_learners_publish_never_brings_a_removed_buffer_back(tmp_path):
    """A learner publishing its progress while overwrite=True removed the buffer made
    <root>/zreplay/learners again: the path was then 'not a zreplay buffer' for good."""
    import shutil

    path = tmp_path / "b"
    _filled(path, 0, n=1)
    lim = zreplay.SampleToInsertRatio(1.0, 1, error_buffer=100, publish_every_s=0)
    view = zreplay.open(path, rate_limiter=lim, learner_id="L")
    shutil.rmtree(path)  # the removal, at the instant the learner publishes
    view.core.rate.publish()
    assert not path.exists()
    path.mkdir()  # a removal that left only zreplay's own directories behind
    (path / "zreplay" / "learners").mkdir(parents=True)
    (path / "zreplay" / "learners" / "L.json").write_text("{}")
    with pytest.raises(zreplay.FormatError, match="start it afresh with overwrite=True"):
        trb(path)
    with pytest.raises(zreplay.FormatError, match="being created or removed"):
        zreplay.open(path)
    with trb(path, overwrite=True) as buf:
        buf.add_trajectories([make_traj(0)])
    assert zreplay.open(path).num_trajectories == 1


def test_priorities_of_a_batch_drawn_before_a_load_do_not_land_on_the_loaded_rows(tmp_path):
    """The loaded rows keep the checkpoint's row numbers, which the old batch's indices
    may name: they were applied to rows they never drew (a prefetched batch, a TD error
    computed while another thread loaded)."""
    from zreplay.samplers import Prioritized

    _filled(tmp_path / "other", 50)
    with trb(tmp_path / "other", sampler=Prioritized(alpha=1.0, eps=0.0)) as ck:
        ck.update_priorities(np.arange(72), 1.0)
    buf = trb(tmp_path / "b", sampler=Prioritized(alpha=1.0, eps=0.0))
    buf.add_trajectories([make_traj(i) for i in range(4)])
    old = buf.sample(64)["index"]
    buf.load_checkpoint(str(tmp_path / "other"))
    assert buf.update_priorities(old, 1e9) == 0  # skipped, as for evicted rows
    new = buf.sample(64)
    assert set(check_rows(new) // 10000) <= {50, 51, 52, 53}
    np.testing.assert_array_equal(buf.priorities(new["index"]), 1.0)  # untouched
    assert buf.update_priorities(new["index"], 5.0) == 64  # drawn from these rows: applies
    np.testing.assert_array_equal(buf.priorities(new["index"]), 5.0)
    buf.close()

    view = zreplay.open(tmp_path / "b", sampler=Prioritized(alpha=1.0, eps=0.0))
    before = view.sample(32)["index"]
    with trb(tmp_path / "b") as w:
        w.load_checkpoint(str(tmp_path / "other"))
    view.refresh()
    assert view.update_priorities(before, 1e9) == 0
    after = view.sample(32)["index"]
    assert view.update_priorities(after, 2.0) == 32
