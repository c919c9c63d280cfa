"""tests/README.md maps each concept to its file: every test file is on it, and every file
it names is here."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
MAP = TESTS / "README.md"


def named(text: str) -> set[str]:
    """The ``.py`` files a page names in backticks."""
    return set(re.findall(r"`([\w/]+\.py)`", text))


def test_every_test_file_is_on_the_map():
    files = {p.name for p in TESTS.glob("*.py")}
    missing = sorted(files - named(MAP.read_text()))
    assert not missing, f"tests/README.md does not say what these test: {missing}"


def test_the_map_names_only_files_that_exist():
    gone = sorted(n for n in named(MAP.read_text()) if not (TESTS / n).exists())
    assert not gone, f"tests/README.md names files that are not in tests/: {gone}"


def test_the_checks_see_a_file_left_off_and_one_made_up():
    text = "| concept | `test_a.py` |\n| other | `test_b.py`, `helpers.py` |"
    assert named(text) == {"test_a.py", "test_b.py", "helpers.py"}
    assert "test_c.py" not in named(text)


def test_every_test_left_to_the_slow_set_exists():
    """tests/slow_tests.txt names only test functions that exist (a renamed or removed test
    would otherwise linger there, and its new name silently join the quick set)."""
    from conftest import slow_test_ids

    gone = []
    for node in sorted(slow_test_ids()):
        path, name = node.split("::")[0], node.split("::")[-1].split("[")[0]
        file = TESTS.parent / path
        if not file.is_file() or f"def {name}(" not in file.read_text():
            gone.append(node)
    assert gone == []
