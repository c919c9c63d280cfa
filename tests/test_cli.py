"""The ``zreplay`` command line: output, ``--json``, exit codes, damage, round trips.

Most commands run in-process through ``zreplay.cli.main`` (fast); a few run as
``python -m zreplay.cli`` subprocesses to check what a shell sees: exit statuses, one
error line on stderr and no traceback, no progress-bar noise when stderr is not a TTY.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_traj, shard_files, zreplay_cli

import zreplay
from zreplay.cli import main
from zreplay.schema import flatten
from zreplay.store.commit import read_commit


def run(capsys, *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def run_json(capsys, *args: str) -> tuple[int, dict]:
    status, out, _ = run(capsys, *args, "--json")
    return status, json.loads(out)


@pytest.fixture(scope="module")
def rlinf_buffer(tmp_path_factory) -> Path:
    """RLinf-style trajectories [T=6, B=3]: nested keys, 8x8 RGB frames, rewards [C]."""
    path = tmp_path_factory.mktemp("cli") / "rlinf.zarr"
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path)) as buf:
        buf.add_trajectories([make_traj(i) for i in range(3)])
    return path


@pytest.fixture(scope="module")
def episode_buffer(tmp_path_factory) -> Path:
    """stable-worldmodel-style episodes: grayscale (H, W, 1) pixels, scalar reward."""
    path = tmp_path_factory.mktemp("cli") / "episodes.zarr"
    rng = np.random.default_rng(0)
    rb = zreplay.ReplayBuffer(1000, path=path)
    try:
        for length in (5, 9, 7, 4):
            rb.write_episode(
                {
                    "pixels": rng.integers(0, 255, (length, 12, 12, 1), dtype=np.uint8),
                    "action": rng.standard_normal((length, 2)).astype(np.float32),
                    "reward": np.full(length, 0.5, np.float32),
                    "terminated": np.arange(length) == length - 1,
                }
            )
    finally:
        rb.close()  # a `with` block only flushes: close() releases the writer lock
    return path


def damaged_copy(src: Path, dst: Path, key: str) -> Path:
    """A copy of ``src`` with one byte flipped inside a compressed chunk of ``key``."""
    import shutil

    shutil.copytree(src, dst)
    f = shard_files(dst, key)[0]
    data = bytearray(f.read_bytes())
    data[len(data) // 3] ^= 0x40
    f.write_bytes(bytes(data))
    return dst


def assert_one_line_error(err: str, command: str, *fragments: str) -> None:
    """One line on stderr, ``zreplay <command>: error: ...`` (argparse's form), holding
    each fragment, and no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"zreplay {command}: error: "), err
    assert "Traceback" not in err
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])


# -- info --------------------------------------------------------------------------


def test_info_reports_schema_counts_sizes_and_last_commit(capsys, rlinf_buffer):
    view = zreplay.open(rlinf_buffer)
    status, info = run_json(capsys, "info", str(rlinf_buffer))
    assert status == 0 and info["ok"] and info["kind"] == "zreplay"
    assert (info["trajectories"], info["rows"]) == (3, 3 * 18)
    assert info["episodes"] == view.num_episodes > 3
    assert [s["writer_id"] for s in info["segments"]] == ["default"]
    assert info["last_commit"] == read_commit(rlinf_buffer / "segments" / "default").time
    assert set(info["keys"]) == set(view.keys())
    img = info["keys"]["curr_obs/main_images"]
    assert (img["dtype"], img["row_shape"]) == ("uint8", [8, 8, 3])
    assert img["raw_bytes"] == 54 * 8 * 8 * 3
    data_dir = rlinf_buffer / "segments" / "default" / "data" / "curr_obs" / "main_images"
    assert img["disk_bytes"] == sum(f.stat().st_size for f in data_dir.rglob("*") if f.is_file())
    assert img["compression_ratio"] == round(img["raw_bytes"] / img["disk_bytes"], 2)
    assert info["keys"]["rewards"]["row_shape"] == [2]

    status, out, err = run(capsys, "info", str(rlinf_buffer))
    assert status == 0 and err == ""
    assert "trajectories 3" in out and "rows 54" in out and "last commit" in out
    assert any(
        line.split()[:3] == ["curr_obs/main_images", "uint8", "[8,"] for line in out.splitlines()
    )


def test_info_of_an_hdf5_dump(capsys, episode_buffer, tmp_path):
    h5 = tmp_path / "episodes.h5"
    assert main(["export", str(episode_buffer), str(h5), "--format", "hdf5", "-q"]) == 0
    capsys.readouterr()
    status, info = run_json(capsys, "info", str(h5))
    assert status == 0 and info["kind"] == "hdf5"
    assert (info["episodes"], info["rows"], info["max_episode_length"]) == (4, 25, 9)
    assert info["episodes_terminated"] == 4
    assert info["keys"]["pixels"]["row_shape"] == [12, 12, 1]


# -- verify and damage ---------------------------------------------------------------


def test_verify_exit_codes_on_healthy_and_damaged_buffers(rlinf_buffer, tmp_path):
    ok = zreplay_cli("verify", str(rlinf_buffer))
    assert ok.returncode == 0, ok.stderr
    assert "OK" in ok.stdout and ok.stderr == ""  # no progress bar: stderr is not a TTY

    bad = damaged_copy(rlinf_buffer, tmp_path / "bad.zarr", "rewards")
    got = zreplay_cli("verify", str(bad), "--json")
    assert got.returncode == 1
    report = json.loads(got.stdout)
    assert not report["ok"] and len(report["problems"]) == 1
    assert "key 'rewards'" in report["problems"][0]


def test_damaged_chunk_fails_reads_with_one_line(capsys, rlinf_buffer, tmp_path):
    bad = damaged_copy(rlinf_buffer, tmp_path / "bad.zarr", "rewards")
    status, info = run_json(capsys, "info", str(bad))  # metadata: still readable
    assert status == 0 and "damaged" in info["rewards"]["error"]
    status, out, err = run(capsys, "export", str(bad), str(tmp_path / "x.h5"), "--format", "hdf5")
    assert status == 1 and out == ""
    assert_one_line_error(err, "export", "key 'rewards'", "damaged")
    assert not (tmp_path / "x.h5").exists()
    status, out, _ = run(capsys, "verify", str(bad))
    assert status == 1 and "1 problem(s)" in out and "key 'rewards'" in out


def test_truncated_commit_record(capsys, rlinf_buffer, tmp_path):
    import shutil

    bad = tmp_path / "bad.zarr"
    shutil.copytree(rlinf_buffer, bad)
    commit = bad / "segments" / "default" / "zreplay" / "commit.json"
    commit.write_text(commit.read_text()[:40])
    got = zreplay_cli("info", str(bad))
    assert got.returncode == 1 and got.stdout == ""
    assert_one_line_error(got.stderr, "info", "commit record is unreadable")
    status, report = run_json(capsys, "verify", str(bad))
    assert status == 1 and "commit record is unreadable" in report["problems"][0]
    status, out, err = run(capsys, "plot", str(bad), "--out", str(tmp_path / "p.png"), "--json")
    assert status == 1 and json.loads(out) == {
        "ok": False,
        "error": err.strip().removeprefix("zreplay plot: error: "),
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["info", "{missing}"],
        ["verify", "{missing}"],
        ["export", "{missing}", "{tmp}/o.h5", "--format", "hdf5"],
        ["import", "{missing}", "{tmp}/dst.zarr"],
        ["plot", "{missing}", "--out", "{tmp}/p.png"],
    ],
)
def test_missing_path_is_a_one_line_error(capsys, tmp_path, argv):
    argv = [a.format(missing=tmp_path / "nope", tmp=tmp_path) for a in argv]
    status, out, err = run(capsys, *argv)
    assert status == 1 and out == ""
    assert_one_line_error(err, argv[0], "nope: no such file or directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_non_buffers_and_usage_errors(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    status, _, err = run(capsys, "info", str(tmp_path))
    assert status == 1
    assert_one_line_error(err, "info", "not a zreplay buffer")
    status, _, err = run(capsys, "info", str(tmp_path / "notes.txt"))
    assert status == 1
    assert_one_line_error(err, "info", "neither a zreplay buffer directory nor an HDF5 file")
    status, _, err = run(capsys, "import", str(tmp_path / "notes.txt"), str(tmp_path / "d"))
    assert status == 1
    assert_one_line_error(err, "import", "neither an RLinf buffer directory")

    got = zreplay_cli("export", str(tmp_path), str(tmp_path / "o"), "--format", "zip")
    assert got.returncode == 2 and "invalid choice: 'zip'" in got.stderr
    for argv in (["info"], ["frobnicate"], ["plot"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    got = zreplay_cli()  # no command: the help, listing every command, as a usage error
    assert got.returncode == 2 and got.stdout == ""
    assert all(c in got.stderr for c in ("usage: zreplay", "demo", "info", "verify", "plot"))


# -- export / import -----------------------------------------------------------------


def assert_same_episodes(a: Path, b: Path) -> None:
    va, vb = zreplay.open(a), zreplay.open(b)
    assert va.num_episodes == vb.num_episodes > 0
    ta, tb = va.episode_table(), vb.episode_table()
    for col in ("length", "terminated", "truncated"):
        np.testing.assert_array_equal(ta[col], tb[col], err_msg=col)
    for e in range(va.num_episodes):
        ea, eb = flatten(va.episode(e)), flatten(vb.episode(e))
        assert ea.keys() == eb.keys()
        for k in ea:
            assert ea[k].dtype == eb[k].dtype
            np.testing.assert_array_equal(ea[k], eb[k], err_msg=f"episode {e} {k}")


def test_hdf5_export_import_round_trip(capsys, rlinf_buffer, tmp_path):
    h5, dst = tmp_path / "eps.h5", tmp_path / "back.zarr"
    status, exported = run_json(capsys, "export", str(rlinf_buffer), str(h5), "--format", "hdf5")
    assert status == 0 and exported["episodes"] == zreplay.open(rlinf_buffer).num_episodes
    status, imported = run_json(capsys, "import", str(h5), str(dst))
    assert status == 0 and imported["kind"] == "hdf5" and imported["rows"] == 54
    assert_same_episodes(rlinf_buffer, dst)


@pytest.mark.parametrize("fmt", ["pt", "pkl"])
def test_rlinf_export_import_round_trip(capsys, rlinf_buffer, tmp_path, fmt):
    out, dst = tmp_path / "rlinf", tmp_path / "back.zarr"
    status, exported = run_json(capsys, "export", str(rlinf_buffer), str(out), "--format", fmt)
    assert status == 0 and exported["trajectories"] == 3
    assert len(list(out.glob(f"trajectory_*.{fmt}"))) == 3
    meta = json.loads((out / "metadata.json").read_text())
    assert (meta["size"], meta["total_samples"], meta["trajectory_format"]) == (3, 54, fmt)
    if fmt == "pkl":  # pickles run code on load: refused unless asked for
        status, _, err = run(capsys, "import", str(out), str(dst))
        assert status == 1 and not dst.exists()
        assert_one_line_error(err, "import", "--allow-pickle")
    args = ["--allow-pickle"] if fmt == "pkl" else []
    status, imported = run_json(capsys, "import", str(out), str(dst), *args)
    assert status == 0 and (imported["kind"], imported["trajectories"]) == ("rlinf", 3)
    va, vb = zreplay.open(rlinf_buffer), zreplay.open(dst)
    for i in range(3):
        ta, tb = va.trajectory(i), vb.trajectory(i)
        for k in ("trajectory_id", "max_episode_length", "model_weights_id"):
            assert ta.pop(k) == tb.pop(k), k
        fa, fb = flatten(ta), flatten(tb)
        assert fa.keys() == fb.keys()
        for k in fa:
            np.testing.assert_array_equal(fa[k], fb[k], err_msg=f"trajectory {i} {k}")
    assert_same_episodes(rlinf_buffer, dst)


def test_outputs_are_not_clobbered_without_overwrite(capsys, episode_buffer, tmp_path):
    h5 = tmp_path / "eps.h5"
    h5.write_text("precious")
    status, _, err = run(capsys, "export", str(episode_buffer), str(h5), "--format", "hdf5")
    assert status == 1 and h5.read_text() == "precious"
    assert_one_line_error(err, "export", "--overwrite")
    status, _, err = run(
        capsys, "export", str(episode_buffer), str(h5), "--format", "hdf5", "--overwrite"
    )
    assert status == 1 and h5.read_text() == "precious"  # not an HDF5 file: never replaced
    assert_one_line_error(err, "export", "is not an HDF5 file")
    h5.unlink()
    assert main(["export", str(episode_buffer), str(h5), "--format", "hdf5"]) == 0
    dst = tmp_path / "dst.zarr"
    assert main(["import", str(h5), str(dst)]) == 0
    assert main(["import", str(h5), str(dst)]) == 1
    assert main(["import", str(h5), str(dst), "--overwrite"]) == 0
    capsys.readouterr()
    assert_same_episodes(episode_buffer, dst)


def test_progress_callbacks_count_the_work(rlinf_buffer, tmp_path):
    seen = []
    report = zreplay.verify(rlinf_buffer, progress=lambda w, k, n: seen.append((w, k, n)))
    n_keys = len(zreplay.open(rlinf_buffer).keys())
    assert sum(n for _, _, n in seen) == report.rows_checked * n_keys == 54 * n_keys
    assert {k for _, k, _ in seen} == set(zreplay.open(rlinf_buffer).keys())
    view, ticks = zreplay.open(rlinf_buffer), []
    zreplay.dump(view, tmp_path / "e.h5", progress=ticks.append)
    assert sum(ticks) == view.num_episodes and min(ticks) > 0  # one tick per batch read
    assert main(["export", str(rlinf_buffer), str(tmp_path / "r"), "--format", "pt", "-q"]) == 0
    ticks = []
    zreplay.import_rlinf(str(tmp_path / "r"), str(tmp_path / "b.zarr"), progress=ticks.append)
    assert ticks == [1] * 3


# -- plot and demo -------------------------------------------------------------------


def test_plot_writes_a_png(capsys, rlinf_buffer, episode_buffer, tmp_path):
    png = tmp_path / "rlinf.png"
    status, got = run_json(capsys, "plot", str(rlinf_buffer), "--out", str(png), "--dpi", "40")
    assert status == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert got["reward_key"] == "rewards"
    assert got["image_keys"] == ["curr_obs/main_images", "next_obs/main_images"]
    view = zreplay.open(rlinf_buffer)
    returns = [view.episode(e, keys=["rewards"])["rewards"].sum() for e in range(view.num_episodes)]
    assert got["episodes"] == view.num_episodes
    assert got["mean_return"] == pytest.approx(np.mean(returns))

    status, out, _ = run(capsys, "plot", str(episode_buffer), "--out", str(tmp_path / "e.png"))
    assert status == 0 and "4 episodes" in out and "mean return 3.12" in out and "pixels" in out


def test_demo_still_runs(capsys, tmp_path):
    status, out, _ = run(
        capsys, "demo", "--path", str(tmp_path / "demo.zarr"), "--trajectories", "2"
    )
    assert status == 0 and "round trip of trajectory 0 bit-exact: True" in out


# -- what a new user asks of info, plot and verify -------------------------------------


def test_info_reports_rewards_returns_and_each_keys_layout(capsys, episode_buffer, tmp_path):
    status, info = run_json(capsys, "info", str(episode_buffer))
    rw = info["rewards"]
    assert status == 0 and rw["key"] == "reward"
    assert rw["per_step"] == {"mean": 0.5, "std": 0.0, "min": 0.5, "max": 0.5}
    assert rw["returns"]["min"] == 2.0 and rw["returns"]["max"] == 4.5  # lengths 4 and 9
    assert rw["returns"]["mean"] == pytest.approx(0.5 * 25 / 4)
    px = info["keys"]["pixels"]
    layout = zreplay.open(episode_buffer).root.schema()[1]["pixels"]
    assert (px["chunk_rows"], px["shard_rows"]) == (layout.chunk_rows, layout.shard_rows)
    assert px["codec"] == f"{layout.codec} level {layout.level}"
    status, out, _ = run(capsys, "info", str(episode_buffer))
    assert "reward per episode (return): mean 3.125, std" in out and "min 2, max 4.5" in out
    assert "chunk rows" in out and f"{layout.codec} level {layout.level}" in out

    h5 = tmp_path / "e.h5"
    assert main(["export", str(episode_buffer), str(h5), "--format", "hdf5", "-q"]) == 0
    capsys.readouterr()
    status, info = run_json(capsys, "info", str(h5))
    assert info["rewards"]["returns"]["max"] == 4.5
    assert info["keys"]["pixels"]["codec"] == "gzip level 4 + shuffle"


def test_plot_colours_endings_averages_returns_and_defaults_its_output(
    capsys, episode_buffer, tmp_path
):
    got = zreplay_cli("plot", str(episode_buffer), "--json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    info = json.loads(got.stdout)
    png = tmp_path / "episodes.png"  # <buffer name>.png in the current directory
    assert info["out"] == "episodes.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (info["episodes_terminated"], info["episodes_truncated"]) == (4, 0)
    assert info["moving_average_window"] == 2
    from zreplay.cli.plot import moving_average

    avg, window = moving_average(np.array([1.0, 3.0, 5.0, 7.0]))
    assert window == 2 and avg.tolist() == [2.0, 4.0, 6.0]
    # the axes drawn: one point colour per ending, a mean line, a length histogram
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    save = plt.Figure.savefig
    plt.Figure.savefig = lambda fig, *a, **k: figures.append(fig) or save(fig, *a, **k)
    try:
        assert run(capsys, "plot", str(episode_buffer), "--out", str(tmp_path / "p.png"))[0] == 0
    finally:
        plt.Figure.savefig = save
    titles = [ax.get_title() for ax in figures[0].axes]
    assert "episode lengths" in titles and "per-step 'reward'" in titles
    ret = figures[0].axes[titles.index("episode return (sum of 'reward')")]
    labels = ret.get_legend_handles_labels()[1]
    assert "terminated (4)" in labels and "mean of 2" in labels


def test_hdf5_export_makes_its_directory(capsys, rlinf_buffer, tmp_path):
    out = tmp_path / "new" / "dir" / "ep.h5"
    status, _, err = run(capsys, "export", str(rlinf_buffer), str(out), "--format", "hdf5", "-q")
    assert status == 0, err
    assert zreplay.load_hdf5(out).num_episodes == zreplay.open(rlinf_buffer).num_episodes


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_plot_leaves_non_finite_rewards_out(capsys, tmp_path, bad):
    path = tmp_path / "buf"
    rewards = np.random.default_rng(0).random((20, 2)).astype(np.float32)
    rewards[3, 1] = bad
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path)) as b:
        b.add_trajectories([{"obs": np.zeros((20, 2, 8, 8, 3), np.uint8), "rewards": rewards}])
    png = tmp_path / "p.png"
    status, _, err = run(capsys, "plot", str(path), "--out", str(png))
    assert status == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bad_dpi_is_a_usage_error(capsys, rlinf_buffer, tmp_path):
    with pytest.raises(SystemExit) as done:  # argparse's usage error: status 2
        main(["plot", str(rlinf_buffer), "--dpi", "0", "--out", str(tmp_path / "p.png")])
    assert done.value.code == 2 and "--dpi" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("n", ["0", "-3", "x"])
def test_demo_refuses_a_bad_trajectory_count_as_a_usage_error(capsys, tmp_path, n):
    with pytest.raises(SystemExit) as done:
        main(["demo", "--path", str(tmp_path / "d.zarr"), "--trajectories", n])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "Traceback" not in err
    assert (
        f"zreplay demo: error: argument --trajectories: must be a positive integer, got '{n}'"
        in err
    )
    assert list(tmp_path.iterdir()) == []


def test_demo_refuses_a_file_or_a_folder_that_is_not_a_buffer(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("precious")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    for name in ("notes.txt", "mine"):
        status, out, err = run(
            capsys, "demo", "--path", str(tmp_path / name), "--trajectories", "1"
        )
        assert status == 1 and out == ""
        assert_one_line_error(err, "demo", "is not a zreplay buffer; refusing to overwrite it")
    assert (tmp_path / "notes.txt").read_text() == "precious"
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["thesis.tex"]


def test_verify_problems_do_not_send_the_user_back_to_verify(capsys, rlinf_buffer, tmp_path):
    """Read errors elsewhere advise running zreplay.verify; verify's own report names the
    damage only."""
    bad = damaged_copy(rlinf_buffer, tmp_path / "bad.zarr", "rewards")
    commit = bad / "segments" / "default" / "zreplay" / "commit.json"
    for damage in ("chunk", "commit"):
        if damage == "commit":
            commit.write_text(commit.read_text()[:40])
        status, out, err = run(capsys, "verify", str(bad))
        assert status == 1 and "1 problem(s)" in out and err == ""
        assert "zreplay.verify" not in out, out
        assert ("key 'rewards'" if damage == "chunk" else "commit record is unreadable") in out
    with pytest.raises(zreplay.errors.CorruptBufferError, match=r"zreplay\.verify\(\)"):
        zreplay.open(bad)  # outside verify the advice stays
