"""The docs site (mkdocs.yml) draws without a network: its diagrams are static SVG in
docs/img, not mermaid (which the theme fetches from a CDN, leaving raw text offline), and
it loads no web fonts; long lines in code blocks wrap."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_no_page_needs_mermaid_and_every_image_is_in_docs():
    images = 0
    for page in DOCS.rglob("*.md"):
        text = page.read_text()
        assert "```mermaid" not in text, f"{page}: a mermaid block needs the CDN; use an SVG"
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
            assert not target.startswith(("http://", "https://")), (page, target)
            assert (page.parent / target).is_file(), (page, target)
            images += 1
    assert images >= 2  # the overview (index.md) and the layers (architecture.md)


def test_the_site_loads_no_fonts_and_wraps_code():
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^  font: false\b", config, re.M)
    assert "name: mermaid" not in config  # no mermaid fence: the theme would fetch mermaid
    css = re.search(r"^extra_css:\n  - (\S+)", config, re.M)
    assert css and "white-space: pre-wrap" in (DOCS / css.group(1)).read_text()


def test_the_svgs_are_self_contained():
    for svg in (DOCS / "img").glob("*.svg"):
        text = svg.read_text()
        assert text.startswith("<svg") and "<title>" in text
        assert not re.search(r"(href|src)=\"https?://", text), svg  # nothing fetched to draw it
