"""``zreplay upgrade PATH``: :func:`zreplay.upgrade`; exit 0 also when already current.

``--codec KEY=CODEC[:LEVEL]`` (repeatable) then re-encodes those keys with another codec
(:func:`zreplay.store.recode.recode`: an image codec for camera frames, or ``zstd``), all
or nothing."""

from __future__ import annotations

from .output import EXIT_OK, Result
from .paths import buffer_dir


def run(args) -> Result:
    from ..store.format import FORMAT_VERSION
    from ..store.recode import parse_codec, recode
    from ..store.upgrade import upgrade

    path = buffer_dir(args.path)
    codecs = dict(parse_codec(c) for c in getattr(args, "codec", None) or [])
    was = upgrade(path)
    result = {"path": str(path), "from_format": was, "format": FORMAT_VERSION}
    if was is None:
        text = f"{path} is already zreplay format {FORMAT_VERSION}; nothing to do"
    else:
        text = f"upgraded {path} from zreplay format {was} to {FORMAT_VERSION}"
    if codecs:
        changed = recode(path, codecs)
        result["recoded"] = changed
        for key, c in changed.items():
            text += f"\nre-encoded {key}: {c['from']['codec']} -> {c['to']['codec']}"
        if not changed:
            text += "\nevery key already has the codec asked for; nothing re-encoded"
    return EXIT_OK, result, text
