"""A griffe extension for the API pages: zreplay's docstrings as mkdocstrings renders them.

The package's docstrings are Google style with reStructuredText roles.  Two things in them
are not Google style, and this rewrites them in the rendered copy only (the source is
untouched):

* a facade's constructor documents its own ecosystem's arguments and zreplay's under two
  labelled headers, ``Args (RLinf's, same meaning):`` and ``Args (zreplay's):``; griffe
  knows ``Args:`` and ``Other Parameters:``, so the first labelled header becomes
  ``Args:`` and the next ``Other Parameters:``;
* cross-reference roles (``:class:`~zreplay.core.BufferCore```, ``:meth:`export```)
  become code spans (``BufferCore``, ``export``).
"""

from __future__ import annotations

import re

import griffe

LABELLED = re.compile(r"^(?P<indent>[ \t]*)Args \((?P<label>[^)\n]*)\):[ \t]*$", re.M)
ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")


def _role(m: re.Match) -> str:
    target = m["target"]
    return f"`{target.rsplit('.', 1)[-1] if m['tilde'] else target}`"


def rewrite(text: str) -> str:
    seen = 0

    def header(m: re.Match) -> str:
        nonlocal seen
        seen += 1
        title = "Args:" if seen == 1 else "Other Parameters:"
        return f"{m['indent']}{title}"

    text = LABELLED.sub(header, text)
    return ROLE.sub(_role, text)


class Docstrings(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
