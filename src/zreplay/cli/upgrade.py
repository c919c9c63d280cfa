"""``zreplay upgrade PATH``: :func:`zreplay.upgrade`; exit 0 also when already current."""

from __future__ import annotations

from .output import EXIT_OK, Result
from .paths import buffer_dir


def run(args) -> Result:
    from ..store.format import FORMAT_VERSION
    from ..store.upgrade import upgrade

    path = buffer_dir(args.path)
    was = upgrade(path)
    result = {"path": str(path), "from_format": was, "format": FORMAT_VERSION}
    if was is None:
        text = f"{path} is already zreplay format {FORMAT_VERSION}; nothing to do"
    else:
        text = f"upgraded {path} from zreplay format {was} to {FORMAT_VERSION}"
    return EXIT_OK, result, text
