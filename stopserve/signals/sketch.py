"""Content sketches: how alike two events' texts are, without the texts.

An event's ``sketch`` (trace format v1, optional) is a similarity sketch of its text: the
command or arguments of a ``tool_use``, the output of a ``return``, the message of a
``communicate``, ``delegate`` or ``aggregate``. Two sketches give the estimated Jaccard
similarity of the two texts' shingle sets, so a run that repeats itself with another
timestamp, path or id shows it, where equal ``content_ref`` hashes see only exact repeats.

How a sketch is made (``docs/trace-format.md``, "Content sketches", says why):

1. the text is capped: longer than :data:`MAX_CHARS` characters, its first and last
   ``MAX_CHARS // 2`` are kept;
2. :func:`normalise`: ASCII letters lower-cased, every run of characters holding a digit
   (numbers, timestamps, hex ids, UUIDs, addresses, line numbers, temp names) folded to
   ``0``, as are ``tmpXXXXXXXX`` names without a digit; punctuation becomes space;
3. shingles: each run of :data:`SHINGLE` consecutive words (a text of fewer words is one
   shingle), hashed as a weighted sum of its words' CRC-32s mod 2**32 (``zlib``: the same on
   every machine, process and Python version; Python's own ``hash()`` is salted and never
   used), all shingles at once in big-integer arithmetic;
4. one-permutation MinHash (Li, Owen & Zhang 2012) into :data:`BINS` bins, empty bins
   filled by rotation (Shrivastava & Li 2014) with a fixed pseudo-random offset per
   distance, and only the lowest :data:`BITS` bits of each bin's minimum kept (b-bit
   MinHash, Li & König 2010): 128 four-bit values, written as 128 hex digits after the
   version prefix ``mh1:``.

Only the standard library and orjson are imported: the ``stopserve hook`` process sketches
with this module (no numpy, no pydantic). Every step is a C-level pass (regex, translate,
split, map, sort, dict); ``bench/bench_sketch.py`` measures the cost per event.

>>> a = sketch("Traceback: error at 2026-05-01T10:00:00Z in /tmp/tmpk3j9x2/run.py, line 12")
>>> b = sketch("Traceback: error at 2026-05-02T11:30:07Z in /tmp/tmpq81zzp/run.py, line 40")
>>> a == b, similarity(parse(a), parse(b))
(True, 1.0)
>>> normalise("GET /api/v2/items?id=0x7ffe3a at 10:00:01")
'get api 0 items id 0 at 0'
>>> similarity(parse(sketch("grep -rn needle src")), parse(sketch("ls -la"))) < 0.2
True
"""

from __future__ import annotations

import hashlib
import operator
import re
import zlib
from array import array
from typing import Any, Final, NewType

import orjson

__all__ = [
    "BINS",
    "BITS",
    "MAX_CHARS",
    "PREFIX",
    "SHINGLE",
    "WIRE_CHARS",
    "Sketch",
    "check",
    "normalise",
    "parse",
    "similarity",
    "sketch",
]

#: The wire form's version prefix; a sketch of another version does not compare with this one.
PREFIX: Final = "mh1:"
#: MinHash bins (values) per sketch.
BINS: Final = 128
#: Bits kept of each bin's minimum hash.
BITS: Final = 4
#: Words per shingle.
SHINGLE: Final = 5
#: Characters of a text that are sketched, at most: the first and last half of a longer one.
MAX_CHARS: Final = 1024
#: Characters of the wire form: the prefix and one hex digit per bin.
WIRE_CHARS: Final = len(PREFIX) + BINS

#: A parsed sketch: opaque (its bits are this module's business), hashable and cheap.
Sketch = NewType("Sketch", int)

_HASH_BITS: Final = 32  # zlib.crc32
_BIN_SHIFT: Final = _HASH_BITS - (BINS.bit_length() - 1)  # the top bits choose the bin
_VALUE_MASK: Final = (1 << BITS) - 1  # the lowest bits are the value kept
# Folding, in three passes that the regex engine scans fast (each starts with a digit or a literal):
# a digit and the word characters (and . : -) after it; on the reversed text, the letters before
# such a 0; temp names without a digit.
_DIGITS: Final = re.compile(rb"[0-9][\w.:\-]*")
_LETTERS_BEFORE: Final = re.compile(rb"0[a-z_]+")
_TMP: Final = re.compile(rb"tmp[._]?[a-z_]{8,10}\b")
_LOWER: Final = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"abcdefghijklmnopqrstuvwxyz")
# ASCII letters and digits stay, bytes of non-ASCII UTF-8 stay, the rest is space
_WORDS: Final = bytes(c if (48 <= c <= 57 or 97 <= c <= 122 or c >= 128) else 32 for c in range(256))
_HEX: Final = bytes.maketrans(bytes(range(16)), b"0123456789abcdef")
_WIRE: Final = re.compile(rf"{re.escape(PREFIX)}[0-9a-f]{{{BINS}}}")


def _runs() -> tuple[tuple[bytes, ...], ...]:
    """``_RUN[v][r]``: the hex digits of a run of ``r`` bins whose donor's value is ``v``.

    An empty bin takes the value of the next filled bin to its right, XOR a fixed pseudo-random
    value of its distance to it (farthest first), so two texts whose bins took different donors
    agree on a bin only by chance, bin by bin (without it a short text's sketch is one value
    repeated, and two short texts would agree on all bins or on none).
    """
    seed = hashlib.sha256(PREFIX.encode()).digest()
    stream = b"".join(hashlib.sha256(seed + bytes([i])).digest() for i in range(BINS // 32 + 1))
    offset = bytes([0]) + bytes(b & _VALUE_MASK for b in stream[1:BINS])  # distance 0: the bin's own
    farthest_first = [bytes(reversed(offset[:r])) for r in range(BINS + 1)]
    tables = [bytes((i ^ v) & _VALUE_MASK for i in range(256)) for v in range(1 << BITS)]
    return tuple(tuple(run.translate(table).translate(_HEX) for run in farthest_first) for table in tables)


_RUN: Final = _runs()
_BIN: Final = _BIN_SHIFT.__rrshift__
#: a shingle's hash weighs its words' CRCs by these (odd, below 2**29: five products of a 32-bit
#: CRC stay below 2**64), from the same seed as the offsets
_WORD_WEIGHTS: Final = tuple(
    (int.from_bytes(hashlib.sha256(PREFIX.encode() + b"w" + bytes([j])).digest()[:4], "big") >> 3) | 1
    for j in range(SHINGLE)
)
_VALUE: Final = _VALUE_MASK.__and__
_MATCH_BY_CHANCE: Final = 1.0 / (1 << BITS)
# one bit per 4-bit field: where two parsed sketches differ
_FIELD_LOW_BITS: Final = int("1" * BINS, 16)


def _text(content: Any) -> bytes:
    """The bytes a sketch is computed over: a str as it is, bytes as they are, else JSON; capped."""
    if isinstance(content, str):
        text: str = content
        if len(text) > MAX_CHARS:
            text = text[: MAX_CHARS // 2] + " " + text[-(MAX_CHARS // 2) :]
        return text.encode("utf-8", "surrogatepass")
    if isinstance(content, bytes | bytearray):
        raw = bytes(content)
    else:
        raw = bytes(orjson.dumps(content, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str))
        # the escapes of line breaks and tabs stand for a space, not for the letter after them
        raw = raw.replace(b"\\n", b" ").replace(b"\\t", b" ").replace(b"\\r", b" ")
    if len(raw) > MAX_CHARS:
        raw = raw[: MAX_CHARS // 2] + b" " + raw[-(MAX_CHARS // 2) :]
    return raw


def _words(content: Any) -> list[bytes]:
    raw = _text(content).translate(_LOWER)
    raw = _LETTERS_BEFORE.sub(b"0", _DIGITS.sub(b"0", raw)[::-1])[::-1]
    if b"tmp" in raw:
        raw = _TMP.sub(b"0", raw)
    return raw.translate(_WORDS).split()


def normalise(text: Any) -> str:
    """The words a sketch of ``text`` is computed over, space-separated (capped, folded, lowered).

    >>> normalise("Error E1234 at 0x7f3a2b: took 12.5s, id 3fa9c0d2-0e1b-4c1d-9a7b-5f0e2a1c3d4e")
    'error 0 at 0 took 0 id 0'
    """
    return b" ".join(_words(text)).decode("utf-8", "replace")


def sketch(text: Any) -> str:
    """The wire form of ``text``'s sketch: ``mh1:`` and 128 hex digits.

    ``text`` is the event's text; bytes are read as they are and any other value as its
    JSON (sorted keys), the way :func:`~stopserve.ids.content_ref` hashes it. Equal texts
    give equal sketches on every machine and Python version; so do texts that differ only
    in what :func:`normalise` folds.
    """
    words = _words(text) or [b""]
    n = len(words)
    # each shingle's hash: sum of A[j] * crc32(its j-th word), mod 2**32, for all shingles at once:
    # the words' CRCs as the 64-bit lanes of one big int, the five products added lane-wise
    # (no lane carries: each sum stays below 2**64), the low 32 bits of each lane read back
    lanes = int.from_bytes(array("Q", map(zlib.crc32, words)).tobytes(), "little")
    sums = sum(((lanes >> (64 * j)) * a for j, a in enumerate(_WORD_WEIGHTS)), start=0)
    low = array("I")
    low.frombytes(sums.to_bytes(8 * n, "little"))
    hashes = sorted(low[0 : 2 * max(1, n - SHINGLE + 1) : 2], reverse=True)
    # one-permutation MinHash: bin -> its smallest hash (written last: the hashes come largest first)
    mins = dict(zip(map(_BIN, hashes), hashes, strict=True))
    filled = list(mins)
    filled.reverse()
    values = list(map(_VALUE, mins.values()))
    values.reverse()
    first = filled[0]
    tail = BINS - 1 - filled[-1]
    # bins up to each filled bin take its value; the bins after the last wrap to the first
    runs = [first + 1, *map(operator.sub, filled[1:], filled[:-1])]
    body = b"".join(map(operator.getitem, map(_RUN.__getitem__, values), runs))
    if tail:
        body += _RUN[values[0]][tail + first + 1][:tail]
    return PREFIX + body.decode("ascii")


def check(wire: object) -> str | None:
    """What is wrong with ``wire`` as a sketch (a sentence), or ``None`` when it is one."""
    if not isinstance(wire, str):
        return f"a sketch is a string, got {type(wire).__name__}"
    if _WIRE.fullmatch(wire):
        return None
    shown = wire if len(wire) <= 24 else wire[:20] + "..."
    if not wire.startswith(PREFIX):
        version = wire.partition(":")[0] + ":" if ":" in wire[:12] else None
        if version:
            return f"unknown sketch version {version!r} (this reader knows {PREFIX!r}): {shown!r}"
        return f"a sketch starts with {PREFIX!r}: {shown!r}"
    body = wire[len(PREFIX) :]
    if len(body) != BINS:
        return f"a {PREFIX!r} sketch has {BINS} hex digits after its prefix, got {len(body)}"
    bad = next(i for i, c in enumerate(body) if c not in "0123456789abcdef")
    return f"not a lower-case hex digit at position {len(PREFIX) + bad} of the sketch: {body[bad]!r}"


def parse(wire: str) -> Sketch:
    """The sketch ``wire`` holds; raises :class:`ValueError` saying what is wrong with it."""
    if _WIRE.fullmatch(wire) is None:
        raise ValueError(check(wire))
    return Sketch(int(wire[len(PREFIX) :], 16))


def similarity(a: Sketch, b: Sketch) -> float:
    """Estimated Jaccard similarity of the two texts' shingle sets, in [0, 1].

    The share of bins that agree, less the share that agree by chance (1 in 16 for 4-bit
    values). Equal sketches give 1.0; unrelated texts about 0.
    """
    differ = a ^ b
    differ |= differ >> 2
    differ |= differ >> 1
    agree = 1.0 - (differ & _FIELD_LOW_BITS).bit_count() / BINS
    estimate = (agree - _MATCH_BY_CHANCE) / (1.0 - _MATCH_BY_CHANCE)
    return 0.0 if estimate < 0.0 else estimate
