"""Episode table, clips and n-step returns against brute-force references."""

from __future__ import annotations

import builders
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zreplay
from zreplay.index.episodes import EpisodeView, concat_pieces
from zreplay.index.split import Lanes, split_pieces
from zreplay.sampling.clips import ClipSpec

# -- the episode table ---------------------------------------------------------------


@st.composite
def rollouts(draw):
    """Several [T, B] trajectories of one writer: flags and per-trajectory continues."""
    B = draw(st.integers(1, 4))
    trajs = []
    for _ in range(draw(st.integers(1, 6))):
        T = draw(st.integers(1, 7))
        term = np.array(draw(st.lists(st.booleans(), min_size=T * B, max_size=T * B)))
        trunc = np.array(draw(st.lists(st.booleans(), min_size=T * B, max_size=T * B)))
        term = term.reshape(T, B) & (np.arange(T * B).reshape(T, B) % 3 == 0)
        trunc = trunc.reshape(T, B) & (np.arange(T * B).reshape(T, B) % 4 == 1)
        cont = np.array(draw(st.lists(st.booleans(), min_size=B, max_size=B)))
        trajs.append((T, term, trunc, cont))
    return B, trajs


def brute_episodes(B, trajs):
    """Walk every lane step by step: a list of (rows, terminated, truncated)."""
    episodes, open_ep = [], [None] * B
    row0 = 0
    for T, term, trunc, cont in trajs:
        for b in range(B):
            if not cont[b]:
                open_ep[b] = None
            for t in range(T):
                if open_ep[b] is None:
                    open_ep[b] = [[], False, False]
                    episodes.append(open_ep[b])
                open_ep[b][0].append(row0 + b * T + t)
                if term[t, b] or trunc[t, b]:
                    open_ep[b][1] = bool(term[t, b])
                    open_ep[b][2] = bool(trunc[t, b] and not term[t, b])
                    open_ep[b] = None
        row0 += T * B
    return episodes


@settings(max_examples=200, deadline=None)
@given(rollouts())
def test_pieces_rebuild_the_brute_force_episodes(case):
    B, trajs = case
    parts, lanes, next_ep, row0 = [], None, 0, 0
    for T, term, trunc, cont in trajs:
        cols = {"terminations": term[..., None], "truncations": trunc}
        pieces, lanes, next_ep = split_pieces(
            cols, T, B, row0, next_ep, lanes=lanes, continues=cont
        )
        parts.append(pieces)
        row0 += T * B
    view = EpisodeView({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
    want = brute_episodes(B, trajs)
    # episodes are ordered by id = order of their first step
    assert len(view) == len(want)
    got = []
    for e in range(len(view)):
        rows = view.rows(np.full(view.length[e], e), np.arange(view.length[e]))
        got.append((list(rows), bool(view.terminated[e]), bool(view.truncated[e])))
    assert sorted(got) == sorted((r, a, b) for r, a, b in want)


def test_dones_only_count_as_terminations_and_split_false_keeps_one_episode():
    T, B = 4, 2
    dones = np.zeros((T, B), bool)
    dones[1, 0] = True
    p, lanes, _ = split_pieces({"dones": dones}, T, B, 0, 0, lanes=None)
    assert list(p["length"]) == [2, 2, 4] and list(p["terminated"]) == [True, False, False]
    assert list(lanes.episode) == [1, 2]  # both lanes left running
    p, lanes, _ = split_pieces({"dones": dones}, T, B, 0, 0, lanes=None, split=False)
    assert list(p["length"]) == [4, 4] and list(lanes.episode) == [-1, -1]
    # With terminations/truncations present, a stop flagged only by `dones` is still an
    # end: a termination of unknown cause, never an episode ending with neither flag.
    trunc = np.zeros((T, B), bool)
    trunc[2, 1] = True
    cols = {"dones": dones, "terminations": np.zeros((T, B), bool), "truncations": trunc}
    p, _, _ = split_pieces(cols, T, B, 0, 0, lanes=None)
    assert list(p["length"]) == [2, 2, 3, 1]
    assert list(p["terminated"]) == [True, False, False, False]
    assert list(p["truncated"]) == [False, False, True, False]


def test_continues_with_a_different_B_is_refused_before_anything_is_written(tmp_path):
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "b"))
    buf.add_trajectories([{"rewards": np.zeros((3, 2, 1), np.float32)}])
    with pytest.raises(zreplay.SchemaError, match="lane by lane"):
        buf.add_trajectories([{"rewards": np.zeros((3, 4, 1), np.float32)}], continues=True)
    assert len(buf) == 1
    with pytest.raises(zreplay.SchemaError, match="one per environment"):
        buf.add_trajectories([{"rewards": np.zeros((3, 2, 1), np.float32)}], continues=[1, 0, 1])
    buf.close()
    assert Lanes.closed(2).episode.tolist() == [-1, -1]


# -- episodes spanning trajectories ------------------------------------------------------


def test_episodes_continue_across_trajectories_and_survive_reopen(tmp_path):
    B, T = 3, 10
    rng = np.random.default_rng(0)
    ends = [rng.random((T, B)) < 0.08 for _ in range(6)]  # where each lane's episodes end
    core = builders.writer(tmp_path / "b", seed=1)
    for tid in range(4):
        builders.add(core, tid, T, B, ends=ends[tid], continues=True)
    core.close()
    core = builders.writer(tmp_path / "b", seed=1)
    for tid in range(4, 6):  # lanes left open before close keep going
        builders.add(core, tid, T, B, ends=ends[tid], continues=True)
    want = []  # per lane, cut after every end: episodes as lists of codes (brute force)
    for b in range(B):
        cur = []
        for tid in range(6):
            for t in range(T):
                cur.append(tid * 10000 + b * 100 + t)
                if ends[tid][t, b]:
                    want.append(tuple(cur))
                    cur = []
        want += [tuple(cur)] if cur else []
    want = sorted(want)

    def episodes(c):
        return sorted(tuple(c.episode(e)["reward"].astype(int)) for e in range(c.num_episodes))

    assert core.num_episodes == len(want) and episodes(core) == want
    # clips cross trajectory boundaries inside an episode, never an episode boundary
    code = core.sample_clips(ClipSpec(4), 256)["reward"].astype(np.int64)  # [256, 4]
    lane, step = code // 100 % 100, code // 10000 * T + code % 100
    assert np.all(lane == lane[:, :1]) and np.all(np.diff(step, axis=1) == 1)
    last = {ep[-1] for ep in want}
    assert not any(c in last for c in code[:, :-1].ravel())
    core.flush()
    view = builders.reader(tmp_path / "b")
    assert episodes(view) == want
    view.close()
    core.close()


# -- n-step returns against a brute-force reference ------------------------------------


def make_episodes(rng, n_eps, with_next):
    eps = []
    code = 0
    for _ in range(n_eps):
        L = int(rng.integers(1, 12))
        end = rng.choice(["term", "trunc", "none"])
        obs = np.arange(code, code + L, dtype=np.float64)[:, None]
        code += 1000
        ep = {
            "obs": obs,
            "reward": rng.standard_normal(L).astype(np.float32),
            "terminated": np.zeros(L, bool),
            "truncated": np.zeros(L, bool),
        }
        if end == "term":
            ep["terminated"][-1] = True
        elif end == "trunc":
            ep["truncated"][-1] = True
        if with_next:
            ep["next_obs"] = obs + 0.5  # next of step t: "t + 1" marked with .5
        eps.append(ep)
    return eps


def reference(ep, t, n, gamma, with_next):
    L = len(ep["reward"])
    term = bool(ep["terminated"][-1])
    usable = L if (with_next or term) else L - 1
    m = min(n, usable - t)
    ret = sum(gamma**k * float(ep["reward"][t + k]) for k in range(m))
    ended = term and t + m == L
    disc = 0.0 if ended else gamma**m
    if with_next:
        nxt = ep["next_obs"][t + m - 1, 0]
    else:
        nxt = ep["obs"][min(t + m, L - 1), 0]
    return ret, disc, m, nxt, ended


@pytest.mark.parametrize("with_next", [False, True])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_nstep_matches_brute_force(n, with_next):
    rng = np.random.default_rng(n + 10 * with_next)
    eps = make_episodes(rng, 40, with_next)
    rb = zreplay.ReplayBuffer(10_000, seed=3)
    rb.write_episodes(eps)
    by_code = {int(ep["obs"][0, 0]) // 1000: ep for ep in eps}
    gamma = 0.9
    seen = set()
    for _ in range(20):
        b = rb.sample_nstep(256, n=n, gamma=gamma, obs_key="obs")
        for i in range(256):
            code = b["obs"][i, 0]
            ep, t = by_code[int(code) // 1000], int(code) % 1000
            seen.add((int(code) // 1000, t))
            ret, disc, m, nxt, ended = reference(ep, t, n, gamma, with_next)
            assert b["n_steps"][i] == m
            assert b["return"][i] == pytest.approx(ret, rel=1e-5, abs=1e-5)
            assert b["discount"][i] == pytest.approx(disc, rel=1e-6)
            assert bool(b["terminated_n"][i]) == ended
            if not ended:
                assert b["next_obs"][i, 0] == nxt
    # only steps with something to bootstrap from (or a termination) are sampled
    valid = sum(len(ep["reward"]) - (0 if with_next or ep["terminated"][-1] else 1) for ep in eps)
    assert len(seen) == valid
    rb.close()


def test_frame_stack_from_frames_stored_once_with_zero_and_repeat_padding():
    rb = zreplay.ReplayBuffer(1000, seed=0)
    for e in range(5):
        L = 6
        rb.write_episode(
            {
                "obs": (100 * e + 1 + np.arange(L, dtype=np.float32))[:, None],
                "reward": np.ones(L, np.float32),
                "terminated": np.arange(L) == L - 1,
            }
        )
    for pad in ("zero", "repeat"):
        b = rb.sample_nstep(512, n=2, gamma=0.5, frame_stack=3, pad=pad)
        obs, nxt = b["obs"][..., 0], b["next_obs"][..., 0]
        assert obs.shape == (512, 3) and nxt.shape == (512, 3)
        for row, nrow in zip(obs, nxt, strict=True):
            last = row[-1]
            first = 100 * (int(last) // 100) + 1
            want = [last - 2, last - 1, last]
            want = [x if x >= first else (0 if pad == "zero" else first) for x in want]
            assert list(row) == want
            assert nrow[-1] - last in (1, 2) or nrow[-1] == last  # terminated: unspecified
    rb.close()


def test_truncation_bootstraps_and_termination_does_not():
    rb = zreplay.ReplayBuffer(100)
    for flag in ("terminated", "truncated"):
        L = 3
        ep = {
            "obs": np.arange(L, dtype=np.float32)[:, None],
            "next_obs": np.arange(1, L + 1, dtype=np.float32)[:, None],
            "reward": np.ones(L, np.float32),
            "terminated": np.zeros(L, bool),
            "truncated": np.zeros(L, bool),
        }
        ep[flag][-1] = True
        rb.write_episode(ep)
    b = rb.sample_nstep(400, n=5, gamma=0.5)
    last = b["obs"][:, 0] == 2
    term = last & (b["discount"] == 0)
    trunc = last & (b["discount"] > 0)
    assert term.any() and trunc.any()
    assert np.all(b["discount"][trunc] == 0.5) and np.all(b["next_obs"][trunc, 0] == 3)
    rb.close()


def test_segments_concatenate_with_distinct_episode_ids():
    a, _, _ = split_pieces({}, 2, 2, 0, 0, lanes=None)
    b, _, _ = split_pieces({}, 3, 1, 4, 0, lanes=None)
    view = EpisodeView(concat_pieces([a, b]))
    assert list(view.length) == [2, 2, 3] and not view.multi


def test_nstep_next_obs_mirrors_a_one_key_observation_group():
    """obs group with a single key: next_obs keeps the group's structure (it used to be
    collapsed to one array, clashing with the stored next_obs/<key> column)."""
    rb = zreplay.ReplayBuffer(100, seed=0)
    L = 4
    rb.write_episode(
        {
            "obs": {"state": np.arange(L, dtype=np.float32)[:, None]},
            "next_obs": {"state": np.arange(1, L + 1, dtype=np.float32)[:, None]},
            "reward": np.ones(L, np.float32),
            "truncated": np.arange(L) == L - 1,
        }
    )
    b = rb.sample_nstep(64, n=2, gamma=0.5)
    assert set(b["next_obs"]) == {"state"}
    assert np.array_equal(b["next_obs"]["state"], b["obs"]["state"] + b["n_steps"][:, None])
    rb.close()
