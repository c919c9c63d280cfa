"""What a newcomer reads in README.md: each section with an example leads with it (at most
two lines of prose before the code); the accounting of TorchRL's own tests lives on the
TorchRL page; the README says TorchRL's C++ prioritized replay does not load, and what to
use instead."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def sections() -> dict[str, str]:
    parts = re.split(r"^## ", README, flags=re.M)[1:]
    return {p.split("\n", 1)[0]: p.split("\n", 1)[1] for p in parts}


def test_every_section_with_an_example_leads_with_it():
    for title, body in sections().items():
        if "```" not in body:
            continue
        prose = [
            line
            for line in body.split("```", 1)[0].splitlines()
            if line.strip() and not line.startswith("<!--")
        ]
        assert len(prose) <= 2, (title, prose)


def test_torchrl_accounting_is_on_the_torchrl_page_not_the_readme():
    torchrl = sections()["TorchRL: `zreplay.torchrl.ZarrStorage`"]
    assert "885" not in torchrl and "test_extend_sample_recompile" not in torchrl
    page = (ROOT / "docs" / "torchrl.md").read_text()
    assert "885 of the 913" in page and "test_extend_sample_recompile" in page
    assert "docs/torchrl.md" in torchrl


def test_readme_says_torchrls_cpp_prioritized_replay_does_not_load_and_what_instead():
    torchrl = " ".join(sections()["TorchRL: `zreplay.torchrl.ZarrStorage`"].split())
    assert "`PrioritizedSampler`" in torchrl and "`torchrl._torchrl`" in torchrl
    assert "SumSegmentTreeFp32 is not available" in torchrl
    # what it points to exists (tests/test_torchrl.py checks that the C++ part still fails)
    import zreplay.samplers

    assert "`sampler=zreplay.samplers.Prioritized(...)`" in torchrl
    assert callable(zreplay.samplers.Prioritized)
