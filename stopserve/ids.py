"""How things are named on the wire: run ids and content refs, each defined once.

Light on purpose (no pydantic): the client, the importers, the integrations and the
short-lived ``stopserve hook`` process all name runs and hash content with these,
so equal content gets equal refs wherever it is hashed, and equal-but-for-a-timestamp
content equal sketches (:func:`content_refs`).

>>> content_ref("ls -la") == content_ref("ls -la") != content_ref("ls")
True
>>> bool(RUN_ID.fullmatch("run-42")), bool(RUN_ID.fullmatch("a/b"))
(True, False)
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Final

import orjson

from stopserve.signals import sketch as _sketch

__all__ = ["MAX_RUN_ID_CHARS", "RUN_ID", "RUN_ID_CHARS", "RUN_ID_PATTERN", "content_ref", "content_refs"]

#: Characters a run id may hold (a regex character class body): no '/', no space.
RUN_ID_CHARS: Final = "A-Za-z0-9._:@+-"
#: Length of a run id, at most (the trace id it becomes has the same cap).
MAX_RUN_ID_CHARS: Final = 256
#: A whole run id (the path parameter of ``/v1/runs/{run_id}``, and the body's ``run_id``).
RUN_ID_PATTERN: Final = rf"^[{RUN_ID_CHARS}]{{1,{MAX_RUN_ID_CHARS}}}$"
RUN_ID: Final = re.compile(RUN_ID_PATTERN)

#: Hex digits of a content ref's sha256 (64 bits: equality of content within a run).
_REF_HEX: Final = 16


def content_ref(content: Any) -> str:
    """A short stable hash of ``content`` for ``Event.content_ref``: equal content, equal ref.

    Strings and bytes are hashed as they are; anything else as JSON with sorted keys
    (values JSON cannot hold are hashed as their ``str``). The raw content is never kept.
    """
    if isinstance(content, bytes):
        raw = content
    elif isinstance(content, str):
        raw = content.encode("utf-8", "surrogatepass")
    else:
        raw = orjson.dumps(content, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:_REF_HEX]


def content_refs(content: Any, *, sketch: bool = True, text: Any = None) -> dict[str, str]:
    """The event fields that stand for ``content``: its ``content_ref`` and its ``sketch``.

    What every producer of events (importers, client, integrations, hooks) puts on an event
    for its text, never the text itself; ``sketch=False`` leaves the sketch out. ``text``:
    what to sketch when it is not ``content`` itself (a tool result's output text, where
    ``content`` is the structured result the ref hashes).

    >>> sorted(content_refs("ls -la")), list(content_refs("ls", sketch=False))
    (['content_ref', 'sketch'], ['content_ref'])
    """
    if not sketch:
        return {"content_ref": content_ref(content)}
    return {"content_ref": content_ref(content), "sketch": _sketch.sketch(content if text is None else text)}
