"""Issue 13, item 6: size and count limits hold while the body is read, before validation;
large bodies are validated off the event loop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_service_app import make_client

from stopserve.service.app import create_app
from stopserve.settings import Settings


def events(n: int) -> list[dict[str, Any]]:
    return [{"id": f"e{i}", "t": float(i), "type": "return", "agent": "a"} for i in range(n)]


def test_too_many_events_are_refused_before_the_body_is_validated(tmp_path: Path) -> None:
    # 3,000 events then bytes that are not JSON: validating the body first would answer 422;
    # counting while reading stops at event 2,001 and answers 413
    head = orjson.dumps({"events": events(3000)})[:-2]
    body = head + b', {"id": "tail", "t": 1e9, "type": "return"' + b" ]]]]] not json" * 50
    with make_client(tmp_path, max_body_bytes=8 * 1024 * 1024) as c:
        for path in ("/v1/runs/r/decide", "/v1/decide"):
            r = c.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 413, (path, r.text[:300])
            err = r.json()["error"]
            assert err["type"] == "run_limit" and err["issues"][0]["field"] == "events"
            assert r.headers.get("connection") == "close"
        runs = [{"run_id": f"b{i}", "events": events(10)} for i in range(300)]
        batch = orjson.dumps({"runs": runs})[:-2] + b", {nope" * 100
        r = c.post("/v1/decide:batch", content=batch, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["issues"][0]["field"] == "runs"
        runs = [{"run_id": f"b{i}"} for i in range(1500)]
        batch = orjson.dumps({"runs": runs})[:-2] + b", {nope" * 100
        r = c.post("/v1/decide:batch", content=batch, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["issues"][0]["field"] == "runs"
        c.post("/v1/runs/o/decide", json={"events": events(1)})
        r = c.post(
            "/v1/runs/o/outcome",
            content=body.replace(b'{"events"', b'{"rewards": {"team": 1}, "events"', 1),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413 and r.json()["error"]["issues"][0]["field"] == "events"
        # under the limits, a large body is served as before
        r = c.post("/v1/runs/big/decide", json={"events": events(2000)})
        assert r.status_code == 200 and r.json()["events_accepted"] == 2000


def test_a_large_body_is_validated_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a 2,000-event body is validated, the event loop keeps running other tasks.

    The validation waits until another task on the loop has run: inline, on the loop, that
    could never happen and the wait times out. No clock decides the result."""
    import stopserve.service.body as body_module

    app = create_app(Settings(no_model=True, log_dir=None))
    body = orjson.dumps({"events": events(2000)})
    parse = body_module.parse_body
    ticked = threading.Event()
    seen: list[bool] = []

    parse_started = threading.Event()

    def waiting_parse(*args: Any) -> Any:
        parse_started.set()
        seen.append(ticked.wait(timeout=10))
        return parse(*args)

    monkeypatch.setattr(body_module, "parse_body", waiting_parse)

    async def main() -> int:
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                if parse_started.is_set():
                    ticked.set()
                await asyncio.sleep(0)

        sent: list[dict[str, Any]] = []
        chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)]

        async def receive() -> dict[str, Any]:
            if chunks:
                chunk = chunks.pop(0)
                return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async with app.router.lifespan_context(app):
            scope = {
                "type": "http",
                "method": "POST",
                "path": "/v1/runs/x/decide",
                "raw_path": b"/v1/runs/x/decide",
                "headers": [(b"content-type", b"application/json")],
                "query_string": b"",
                "app": app,
                "scheme": "http",
                "server": ("t", 80),
                "client": ("c", 1),
                "root_path": "",
                "http_version": "1.1",
            }
            task = asyncio.create_task(ticker())
            await app(scope, receive, send)
            done.set()
            await task
        return int(sent[0]["status"])

    status = asyncio.run(main())
    assert status == 200
    assert seen == [True], "the body was validated on the event loop: no other task ran meanwhile"
