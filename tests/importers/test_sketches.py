"""Every importer that has the text sketches it: an event's sketch stays when only what varies
between repeats (digits: timestamps, ids, line numbers, counts) changes in the source text,
while its content_ref changes. Real runs (../shared/data) and the real fixtures in data/."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from sketchkit import traceback_at

from stopserve.importers import IMPORTERS

DATA = Path(__file__).parent / "data"
#: keys whose string values are texts an agent wrote or a tool printed (never ids or times)
TEXT_KEYS = frozenset(
    {
        "content",
        "text",
        "stdout",
        "stderr",
        "output",
        "observation",
        "observations",
        "action",
        "actions",
        "message",
    }
)
_SHIFT = bytes.maketrans(b"0123456789", b"3791846025")


def _shift(value: Any, inside: bool = False) -> Any:
    """``value`` with every digit of its texts replaced by another (the same mapping everywhere)."""
    if isinstance(value, str):
        return (
            value.translate({ord(a): ord(b) for a, b in zip("0123456789", "3791846025", strict=True)})
            if inside
            else value
        )
    if isinstance(value, list):
        return [_shift(v, inside) for v in value]
    if isinstance(value, dict):
        return {k: _shift(v, inside or k in TEXT_KEYS) for k, v in value.items()}
    return value


def _json(src: Path, dst: Path) -> None:
    dst.write_bytes(orjson.dumps(_shift(orjson.loads(src.read_bytes()))))


def _json_lines(src: Path, dst: Path, limit: int | None = None) -> None:
    opener: Callable[..., Any] = gzip.open if src.name.endswith(".gz") else open
    with opener(src, "rb") as fh:
        lines = [line for line in fh if line.strip()][:limit]
    body = b"".join(orjson.dumps(_shift(orjson.loads(line))) + b"\n" for line in lines)
    dst.write_bytes(gzip.compress(body) if dst.name.endswith(".gz") else body)


def _compare(fmt: str, original: Path, shifted: Path, **options: Any) -> None:
    before = list(IMPORTERS[fmt]([original], **options))
    after = list(IMPORTERS[fmt]([shifted], **options))
    assert before and len(before) == len(after)
    changed = 0
    with_text = [e for t in before for e in t.events if e.content_ref is not None and e.type != "stop"]
    assert with_text and all(e.sketch is not None for e in with_text), fmt  # every text is sketched
    for a, b in zip(before, after, strict=True):
        assert [e.type for e in a.events] == [e.type for e in b.events]
        for x, y in zip(a.events, b.events, strict=True):
            assert x.sketch == y.sketch, (fmt, x.id, x.type)
            changed += x.content_ref != y.content_ref and x.sketch is not None
    assert changed >= 3, f"{fmt}: the shifted digits changed only {changed} content refs"


def test_mini_swe_agent_real_run(tmp_path: Path, swe_dir: Path) -> None:
    src = swe_dir / "trajs" / "django__django-10097.traj.json"
    dst = tmp_path / src.name
    _json(src, dst)
    _compare("mini-swe-agent", src, dst)


def test_swe_agent_fixture(tmp_path: Path) -> None:
    src = DATA / "django__django-10097.traj"
    dst = tmp_path / src.name
    _json(src, dst)
    _compare("mini-swe-agent", src, dst)


def test_mint_real_runs(tmp_path: Path, mint_dir: Path) -> None:
    src = next(iter(sorted(mint_dir.rglob("results.jsonl.gz"))))
    rel = src.relative_to(mint_dir)
    for root, fn in ((tmp_path / "a", None), (tmp_path / "b", _json_lines)):
        (root / rel).parent.mkdir(parents=True)
        if fn is None:
            with gzip.open(src, "rb") as fh:
                head = b"".join(line for _, line in zip(range(30), fh, strict=False))
            (root / rel).write_bytes(gzip.compress(head))
        else:
            fn(tmp_path / "a" / rel, root / rel)
    _compare("mint", tmp_path / "a" / rel, tmp_path / "b" / rel)


def test_intercode_real_and_fixture(tmp_path: Path, intercode_dir: Path) -> None:
    for src in (
        next(iter(sorted(intercode_dir.rglob("*.json.gz")))),
        DATA / "intercode" / "ctf" / "ic_ctf_gpt-4_25_turns.json",
    ):
        data = orjson.loads(
            gzip.decompress(src.read_bytes()) if src.name.endswith(".gz") else src.read_bytes()
        )
        small = dict(list(data.items())[:40])
        a, b = tmp_path / f"a-{src.name}".removesuffix(".gz"), tmp_path / f"b-{src.name}".removesuffix(".gz")
        a.write_bytes(orjson.dumps(small))
        b.write_bytes(orjson.dumps(_shift(small)))
        _compare("intercode", a, b)


def test_claude_code_real_session(tmp_path: Path) -> None:
    (src,) = sorted((DATA / "claude-code").glob("*.jsonl"))
    dst = tmp_path / src.name
    _json_lines(src, dst)
    _compare("claude-code", src, dst)


def test_codex_rollout(tmp_path: Path) -> None:
    def rec(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        return {"timestamp": "2026-05-02T08:00:01.000Z", "type": kind, "payload": payload}

    lines = [
        rec("session_meta", {"id": "t-1", "cwd": "/w", "cli_version": "0.130.0"}),
        rec("event_msg", {"type": "user_message", "message": "make tests/test_db.py pass"}),
    ]
    for i in range(4):
        args = orjson.dumps({"cmd": "pytest -q tests/test_db.py"}).decode()
        lines.append(
            rec(
                "response_item",
                {"type": "function_call", "name": "exec_command", "arguments": args, "call_id": f"c{i}"},
            )
        )
        body = f"Process exited with code 1\nOutput:\n{traceback_at(i)}"
        lines.append(
            rec("response_item", {"type": "function_call_output", "call_id": f"c{i}", "output": body})
        )
    a = tmp_path / "a" / "rollout-1.jsonl"
    b = tmp_path / "b" / "rollout-1.jsonl"
    a.parent.mkdir()
    b.parent.mkdir()
    a.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    _json_lines(a, b)
    _compare("codex", a, b)
    (trace,) = IMPORTERS["codex"]([a])
    outs = [e.sketch for e in trace.events if e.type == "return"]
    assert len(outs) == 4 and len(set(outs)) == 1  # the same failure four times: one sketch


def test_openai_chat(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "Fix the failing test in tests/test_api.py"}]
    for i in range(6):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"cmd": "pytest -x"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        out = f"FAILED tests/test_api.py::test_get at 10:0{i}:12 ({i + 3} failed, 40 passed in 1.{i}s)"
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": out})
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(orjson.dumps({"messages": messages, "reward": 0.0}))
    b.write_bytes(orjson.dumps(_shift({"messages": messages, "reward": 0.0})))
    _compare("openai-chat", a, b)


def test_import_no_sketch_leaves_them_out(tmp_path: Path) -> None:
    from stopserve.cli import main
    from stopserve.trace import read_traces

    src = DATA / "django__django-10097.traj"
    for flag, out in (([], tmp_path / "with.jsonl"), (["--no-sketch"], tmp_path / "without.jsonl")):
        assert main(["import", "mini-swe-agent", str(src), "-o", str(out), *flag]) == 0
    (with_,) = read_traces(tmp_path / "with.jsonl")
    (without,) = read_traces(tmp_path / "without.jsonl")
    assert any(e.sketch for e in with_.events) and not any(e.sketch for e in without.events)
    assert [e.content_ref for e in with_.events] == [e.content_ref for e in without.events]
