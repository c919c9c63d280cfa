"""Column names zreplay recognises by convention, in order of preference.

Episode boundaries come from the flag columns, n-step returns from the reward column,
frame stacks and bootstrap observations from the observation columns, and clips keep the
action columns dense under ``frameskip``.  Every such name lives here, so the
conventions are the same for adding, sampling, exporting and plotting.
"""

from __future__ import annotations

TERMINATION_KEYS = ("terminations", "terminated")
TRUNCATION_KEYS = ("truncations", "truncated")
DONE_KEYS = ("dones", "done")
REWARD_KEYS = ("rewards", "reward")
OBS_KEYS = ("obs", "observation", "observations", "curr_obs", "pixels", "state")
# Stored one-step next observations mirror the observation group under this name.
NEXT_OBS = "next_obs"
ACTION_KEYS = ("action",)
