"""Column names zreplay recognises by convention, in order of preference.

Episode boundaries come from the flag columns, n-step returns from the reward column,
frame stacks and bootstrap observations from the observation columns, and clips keep the
action columns dense under ``frameskip``.  Every such name lives here, so the
conventions are the same for adding, sampling, exporting and plotting.
"""

from __future__ import annotations

# TorchRL's ("next", ...) flags come first: its TensorDicts also carry root flags of the
# current step (false but at a reset), while ("next", "done") at row t says transition t
# ended its episode, which is what a flag means here (cut after that row).
TERMINATION_KEYS = ("next/terminated", "terminations", "terminated")
TRUNCATION_KEYS = ("next/truncated", "truncations", "truncated")
DONE_KEYS = ("next/done", "dones", "done")
REWARD_KEYS = ("rewards", "reward")
OBS_KEYS = ("obs", "observation", "observations", "curr_obs", "pixels", "state")
# Stored one-step next observations mirror the observation group under this name.
NEXT_OBS = "next_obs"
# Kept dense under frameskip in clips: stable-worldmodel's "action" and RLinf's "actions".
ACTION_KEYS = ("action", "actions")
