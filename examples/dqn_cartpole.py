"""DQN on CartPole-v1, trained from a persistent zreplay buffer with n-step returns.

The replay buffer lives on disk under ``<run-dir>/buffer`` and the learner state (Q and
target networks, optimizer, env-step counter, epsilon-schedule position, episode returns,
random states) under ``<run-dir>/checkpoint.pt``.  Kill the process at any time and run
the same command again (without ``--kill-at``): it reopens the buffer, loads the last
checkpoint and continues.

    # a full run, "crashing" halfway, then resumed
    python examples/dqn_cartpole.py --run-dir runs/dqn --total-steps 50000 --kill-at 25000
    python examples/dqn_cartpole.py --run-dir runs/dqn --total-steps 50000

How the pieces fit:

* Episodes are collected in Python lists and written whole with ``rb.write_episode`` when
  they end; ``terminated``/``truncated`` are set on the last step only.  ``next_obs`` is
  stored for every step, so the final step of a time-limited (truncated) episode
  bootstraps from its real next observation (``discount = gamma**m``) while a terminated
  window gets ``discount = 0``.
* Targets: ``return + discount * Q_target(next_obs, argmax_a Q(next_obs, a))`` (double
  DQN; ``--no-double`` for the plain max) from ``rb.sample_nstep(batch, n, gamma)``, Huber
  loss, one gradient step per env step after ``--warmup`` stored steps.  Defaults: MLP
  4-128-128-2, Adam with the learning rate decayed linearly 5e-4 -> 5e-5 over the run,
  Polyak target (``--tau 0.005``; ``--tau 0`` for hard copies every ``--target-update``
  gradient steps), n=3, gamma=0.99, epsilon 1.0 -> 0.05 over 10k steps.  About 90 s for
  50k steps on one CPU core; solves CartPole (greedy evaluation 470-500).
* Checkpoints are taken at the first episode end after every ``--checkpoint-every`` env
  steps: ``rb.flush()`` first (every episode written so far is committed), then
  ``torch.save`` to a temporary file, fsync, ``os.replace``.  So a checkpoint never refers
  to data that is not on disk.  The buffer's background writer may have committed a few
  more episodes after the last checkpoint; a resumed run keeps them (off-policy data).
  Whatever was written after the last commit, and the episode in progress, are lost.
* ``--kill-at STEP`` simulates a crash: ``os._exit(KILL_EXIT_CODE)`` right after env step
  ``STEP``, without flushing or closing anything.  Leave it out of the resuming command
  (a run resumed from a checkpoint before ``STEP`` would be killed there again).

Exit codes: 0 solved (greedy evaluation mean >= ``--solved-at``, or ``--no-require-solved``),
1 not solved, 3 (``KILL_EXIT_CODE``) killed by ``--kill-at``, 2 bad arguments.

Machine-readable lines (one JSON object after a fixed tag, on stdout):
``RESUME {...}`` or ``FRESH {...}`` at start, ``CHECKPOINT {...}`` after each checkpoint
(``buffer_steps`` = steps committed when it was taken), ``KILL {...}`` before a simulated
crash, and ``RESULT {...}`` at the end (``eval_mean_return``, ``episodes``, ``env_steps``,
``resumed``, ``buffer_steps``, ...).
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import zreplay

KILL_EXIT_CODE = 3
CHECKPOINT_NAME = "checkpoint.pt"
BUFFER_NAME = "buffer"
ENV_ID = "CartPole-v1"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--total-steps", type=int, default=50_000, help="env steps in all")
    p.add_argument("--kill-at", type=int, default=None, help="os._exit right after this step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-require-solved", action="store_true", help="exit 0 even if unsolved")
    p.add_argument("--solved-at", type=float, default=195.0)
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--checkpoint-every", type=int, default=5_000, help="env steps")
    p.add_argument("--log-every", type=int, default=2_500, help="env steps")
    p.add_argument("--buffer-size", type=int, default=50_000, help="replay capacity (steps)")
    p.add_argument("--warmup", type=int, default=1_000, help="stored steps before training")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument(
        "--lr-end", type=float, default=5e-5, help="learning rate at --total-steps (linear)"
    )
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--n-step", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--train-every", type=int, default=1, help="env steps per gradient step")
    p.add_argument("--target-update", type=int, default=500, help="gradient steps (hard copy)")
    p.add_argument(
        "--tau", type=float, default=0.005, help="Polyak target update per gradient step (0: hard)"
    )
    p.add_argument("--eps-start", type=float, default=1.0)
    p.add_argument("--eps-end", type=float, default=0.05)
    p.add_argument("--eps-decay-steps", type=int, default=10_000)
    p.add_argument("--no-double", action="store_true", help="plain max target (no double DQN)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = p.parse_args(argv)
    if args.total_steps <= 0 or args.checkpoint_every <= 0 or args.n_step < 1:
        p.error("--total-steps, --checkpoint-every and --n-step must be positive")
    return args


def make_q(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2)
    )


def epsilon(step: int, args) -> float:
    frac = min(1.0, step / max(1, args.eps_decay_steps))
    return args.eps_start + frac * (args.eps_end - args.eps_start)


def learning_rate(step: int, args) -> float:
    frac = min(1.0, step / args.total_steps)
    return args.lr + frac * (args.lr_end - args.lr)


def emit(tag: str, **fields) -> None:
    print(f"{tag} {json.dumps(fields, sort_keys=True)}", flush=True)


def save_checkpoint(path: Path, state: dict) -> None:
    """Atomic: write a temporary file, fsync it, rename it over the old checkpoint."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def greedy(q: nn.Module, obs: np.ndarray) -> int:
    with torch.no_grad():
        return int(q(torch.as_tensor(obs, dtype=torch.float32)[None]).argmax(1).item())


def evaluate(q: nn.Module, episodes: int, seed: int) -> list[float]:
    env = gym.make(ENV_ID)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        done, total = False, 0.0
        while not done:
            obs, r, term, trunc, _ = env.step(greedy(q, obs))
            total += float(r)
            done = term or trunc
        returns.append(total)
    env.close()
    return returns


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    run_dir = args.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = run_dir / CHECKPOINT_NAME
    buffer_path = run_dir / BUFFER_NAME

    torch.manual_seed(args.seed)
    q = make_q(args.hidden)
    q_target = copy.deepcopy(q).requires_grad_(False)
    opt = torch.optim.Adam(q.parameters(), lr=args.lr)
    rng = np.random.default_rng(args.seed)

    # An existing buffer directory is resumed by zreplay itself (episodes, sampler RNG);
    # a stale writer lock left by a killed process on this host is taken over.
    buffer_existed = buffer_path.exists()
    rb = zreplay.ReplayBuffer(max_steps=args.buffer_size, path=buffer_path, seed=args.seed)
    buffer_steps_at_start = rb.num_steps_stored

    env_step = episodes = grad_steps = 0
    recent = collections.deque(maxlen=100)  # returns of the last 100 training episodes
    resumed = ckpt_path.exists()
    if resumed:
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        q.load_state_dict(ck["q"])
        q_target.load_state_dict(ck["q_target"])
        opt.load_state_dict(ck["optimizer"])
        env_step, episodes, grad_steps = ck["env_step"], ck["episodes"], ck["grad_steps"]
        recent.extend(ck["recent_returns"])
        rng.bit_generator.state = ck["numpy_rng"]
        torch.set_rng_state(ck["torch_rng"])
        emit(
            "RESUME",
            env_step=env_step,
            episodes=episodes,
            grad_steps=grad_steps,
            epsilon=epsilon(ck["eps_step"], args),
            checkpoint_buffer_steps=ck["buffer_steps"],
            buffer_steps=buffer_steps_at_start,
            buffer_episodes=rb.num_episodes,
        )
    else:
        emit(
            "FRESH",
            buffer_reused=buffer_existed and buffer_steps_at_start > 0,
            buffer_steps=buffer_steps_at_start,
            buffer_episodes=rb.num_episodes,
        )
    print(
        f"run-dir={run_dir} total_steps={args.total_steps} n={args.n_step} "
        f"gamma={args.gamma} batch={args.batch_size} lr={args.lr}->{args.lr_end} "
        f"tau={args.tau} double={not args.no_double}",
        flush=True,
    )

    env = gym.make(ENV_ID)
    gamma_n_keys = ["obs", "action", "reward", "next_obs"]  # what sample_nstep gathers
    next_ckpt = (env_step // args.checkpoint_every + 1) * args.checkpoint_every
    next_log = (env_step // args.log_every + 1) * args.log_every
    losses: list[float] = []
    t_log, step_log = time.perf_counter(), env_step

    def checkpoint() -> None:
        rb.flush()  # every episode written so far is committed before the checkpoint
        committed = rb.num_steps_stored
        save_checkpoint(
            ckpt_path,
            {
                "q": q.state_dict(),
                "q_target": q_target.state_dict(),
                "optimizer": opt.state_dict(),
                "env_step": env_step,
                "eps_step": env_step,  # epsilon schedule position
                "episodes": episodes,
                "grad_steps": grad_steps,
                "recent_returns": list(recent),
                "numpy_rng": rng.bit_generator.state,
                "torch_rng": torch.get_rng_state(),
                "buffer_steps": committed,
                "args": vars(args) | {"run_dir": str(run_dir)},
            },
        )
        emit(
            "CHECKPOINT",
            env_step=env_step,
            episodes=episodes,
            buffer_steps=committed,
            buffer_episodes=rb.num_episodes,
        )

    while env_step < args.total_steps:
        # One episode, collected whole, then written to the buffer.
        obs, _ = env.reset(seed=args.seed * 1_000_003 + episodes)
        ep = {k: [] for k in ("obs", "action", "reward", "next_obs")}
        term = trunc = False
        ep_return = 0.0
        while not (term or trunc):
            if rng.random() < epsilon(env_step, args):
                action = int(rng.integers(2))
            else:
                action = greedy(q, obs)
            next_obs, r, term, trunc, _ = env.step(action)
            ep["obs"].append(np.asarray(obs, np.float32))
            ep["action"].append(action)
            ep["reward"].append(r)
            ep["next_obs"].append(np.asarray(next_obs, np.float32))
            obs = next_obs
            ep_return += float(r)
            env_step += 1

            if rb.num_steps_stored >= args.warmup and env_step % args.train_every == 0:
                for group in opt.param_groups:
                    group["lr"] = learning_rate(env_step, args)
                losses.append(train_step(q, q_target, opt, rb, args, gamma_n_keys))
                grad_steps += 1
                if args.tau > 0:
                    with torch.no_grad():
                        for pt, p in zip(q_target.parameters(), q.parameters(), strict=True):
                            pt.lerp_(p, args.tau)
                elif grad_steps % args.target_update == 0:
                    q_target.load_state_dict(q.state_dict())

            if args.kill_at is not None and env_step == args.kill_at:
                emit("KILL", env_step=env_step, episodes=episodes)
                sys.stdout.flush()
                os._exit(KILL_EXIT_CODE)  # a crash: nothing flushed, closed or saved

            if env_step >= next_log:
                now = time.perf_counter()
                mean100 = float(np.mean(recent)) if recent else float("nan")
                loss = float(np.mean(losses)) if losses else float("nan")
                sps = (env_step - step_log) / max(1e-9, now - t_log)
                print(
                    f"step {env_step:6d}  episodes {episodes:5d}  mean100 {mean100:6.1f}  "
                    f"eps {epsilon(env_step, args):.3f}  lr {learning_rate(env_step, args):.1e}  "
                    f"loss {loss:.4f}  "
                    f"buffer {rb.num_steps_stored} steps/{rb.num_episodes} eps  "
                    f"{sps:.0f} steps/s",
                    flush=True,
                )
                losses.clear()
                t_log, step_log = now, env_step
                next_log += args.log_every
            if env_step >= args.total_steps:
                break  # the last episode is cut without a flag: it is not written

        if not (term or trunc):
            break
        L = len(ep["action"])
        flags_t = np.zeros(L, bool)
        flags_u = np.zeros(L, bool)
        flags_t[-1], flags_u[-1] = term, trunc and not term
        rb.write_episode(
            {
                "obs": np.stack(ep["obs"]),
                "action": np.asarray(ep["action"], np.int64),
                "reward": np.asarray(ep["reward"], np.float32),
                "terminated": flags_t,
                "truncated": flags_u,
                "next_obs": np.stack(ep["next_obs"]),
            }
        )
        episodes += 1
        recent.append(ep_return)
        if env_step >= next_ckpt:
            checkpoint()
            next_ckpt = (env_step // args.checkpoint_every + 1) * args.checkpoint_every
    env.close()
    checkpoint()
    train_s = time.perf_counter() - t_start

    returns = evaluate(q, args.eval_episodes, seed=10_000_000 + args.seed)
    eval_mean = float(np.mean(returns)) if returns else float("nan")
    solved = bool(returns) and eval_mean >= args.solved_at
    result = {
        "eval_mean_return": eval_mean,
        "eval_min_return": float(np.min(returns)) if returns else float("nan"),
        "eval_episodes": len(returns),
        "train_mean_return_100": float(np.mean(recent)) if recent else float("nan"),
        "episodes": episodes,
        "env_steps": env_step,
        "grad_steps": grad_steps,
        "resumed": resumed,
        "buffer_steps_at_start": buffer_steps_at_start,
        "buffer_steps": rb.num_steps_stored,
        "buffer_episodes": rb.num_episodes,
        "solved": solved,
        "train_wall_s": round(train_s, 1),
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    rb.close()
    print("RESULT " + json.dumps(result), flush=True)
    return 0 if solved or args.no_require_solved else 1


def train_step(q, q_target, opt, rb, args, keys) -> float:
    b = rb.sample_nstep(args.batch_size, n=args.n_step, gamma=args.gamma, obs_key="obs", keys=keys)
    obs = torch.from_numpy(b["obs"])
    action = torch.from_numpy(b["action"])
    ret = torch.from_numpy(b["return"])
    disc = torch.from_numpy(b["discount"])
    nxt = torch.from_numpy(b["next_obs"])
    with torch.no_grad():
        if args.no_double:
            bootstrap = q_target(nxt).max(1).values
        else:
            a_star = q(nxt).argmax(1, keepdim=True)
            bootstrap = q_target(nxt).gather(1, a_star).squeeze(1)
        target = ret + disc * bootstrap
    pred = q(obs).gather(1, action[:, None]).squeeze(1)
    loss = F.smooth_l1_loss(pred, target)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(q.parameters(), 10.0)
    opt.step()
    return float(loss.item())


if __name__ == "__main__":
    sys.exit(main())
