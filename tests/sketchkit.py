"""What the sketch tests of every producer share: texts equal but for what varies between repeats."""

from __future__ import annotations

from stopserve.signals import sketch as sk


def traceback_at(n: int) -> str:
    """The same failure, with the timestamp, temp dir, pid, address and line numbers of try ``n``."""
    return (
        "Traceback (most recent call last):\n"
        f'  File "/tmp/tmp{n:04d}xq/repo/app/models.py", line {400 + n}, in save\n'
        "    self.save_base(using=using, force_insert=force_insert)\n"
        "django.db.utils.OperationalError: database is locked "
        f"(at 2026-05-{1 + n % 28:02d}T10:{n % 60:02d}:07.{n:06d}Z, pid {4000 + n}, conn 0x7f3a{n:08x})\n"
    )


def similar(a: str | None, b: str | None) -> float:
    """The similarity of two wire-form sketches (both must be there)."""
    assert a is not None and b is not None, (a, b)
    return sk.similarity(sk.parse(a), sk.parse(b))
