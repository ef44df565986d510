"""StopClient / AsyncStopClient / EventRecorder against a real server on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from servers import LiveServer, free_port
from sketchkit import similar, traceback_at

from stopserve.client import AsyncStopClient, EventRecorder, StopClient, content_ref
from stopserve.errors import ConfigError, RunClosedError, TraceValidationError
from stopserve.objective import Objective
from stopserve.trace import read_traces


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(log_dir=tmp_path_factory.mktemp("client-log"), no_model=True) as srv:
        yield srv


def dead_url() -> str:
    """A loopback port nothing listens on."""
    return f"http://127.0.0.1:{free_port()}"


def step(rec: EventRecorder, i: int) -> list:
    rec.tool_use("bash", content=f"cmd {i}", tokens=100)
    rec.returned("bash", content=f"out {i}")
    return rec.drain()


def logged_trace(server: LiveServer, run_id: str):
    traces = [t for t in read_traces(server.log_dir / "traces.jsonl") if t.trace_id == run_id]
    assert len(traces) == 1, f"{run_id} logged {len(traces)} times"
    return traces[0]


# --------------------------------------------------------------------------- EventRecorder


def test_recorder_ids_clock_and_hashes() -> None:
    rec = EventRecorder(agent="boss")
    a = rec.tool_use("bash", content="ls -la", tokens=12, usd=0.001)
    b = rec.returned("bash", content="a.py", error=True)
    c = rec.tool_use("bash", content="ls -la", agent="worker")
    d = rec.reward(0.5, channel="tests")
    e = rec.stop("quality_met", proposed=True)
    events = rec.drain()
    assert events == [a, b, c, d, e]
    assert len({x.id for x in events}) == 5
    assert [x.t for x in events] == sorted(x.t for x in events)
    assert a.content_ref == c.content_ref == content_ref("ls -la") != b.content_ref
    assert (a.agent, c.agent, a.tokens, a.usd, b.error) == ("boss", "worker", 12, 0.001, True)
    assert (d.value, d.channel, e.reason, e.proposed) == (0.5, "tests", "quality_met", True)
    assert rec.drain() == []
    # two recorders never collide on ids
    assert EventRecorder().tool_use("x").id != EventRecorder().tool_use("x").id


def test_recorder_sketches_content_and_can_be_told_not_to(server: LiveServer) -> None:
    rec = EventRecorder(agent="boss")
    first = rec.returned("bash", content=traceback_at(1))
    again = rec.returned("bash", content=traceback_at(2))
    other = rec.tool_use("bash", content={"cmd": "pytest -x tests/test_views.py", "timeout": 30})
    assert first.content_ref != again.content_ref  # a hash sees two different texts
    assert similar(first.sketch, again.sketch) == 1.0 and similar(first.sketch, other.sketch) < 0.2
    assert rec.reward(1.0).sketch is None  # no content, no sketch
    with StopClient(server.url, timeout=2.0) as client:
        client.decide("c-sketch", rec.drain())
        client.outcome("c-sketch", {"team": 0.0})
    logged = logged_trace(server, "c-sketch").events
    assert [e.sketch for e in logged[:3]] == [first.sketch, again.sketch, other.sketch]
    quiet = EventRecorder(sketch=False)
    assert quiet.returned("bash", content="x").sketch is None and quiet.drain()[0].content_ref


TOOLS = Path(__file__).parent / "signals" / "data" / "tools"  # real tool output (data/README.md)


def test_recorder_reads_progress_from_a_result_s_text(server: LiveServer) -> None:
    rec = EventRecorder()
    failing = (TOOLS / "pytest-fail.txt").read_text()  # pytest 9.0.3: 2 failed, 1 passed, 1 error
    run = rec.returned("bash", content=failing, error=True, exit_code=1)
    assert run.progress is not None
    assert (run.progress.tests_passed, run.progress.tests_failed, run.progress.exit_code) == (1, 3, 1)
    assert run.progress.source == "pytest" and run.progress.error is not None
    status = rec.returned("bash", content=(TOOLS / "git-status.txt").read_text(), exit_code=0)
    assert status.progress is not None and status.progress.files_changed == 4
    wrote = rec.returned("write_file", content="Wrote 12 lines to calc.py", error=False)
    viewed = rec.returned("str_replace_based_edit_tool", content="1 def add", tool_input={"command": "view"})
    assert wrote.progress is not None and viewed.progress is not None
    assert (wrote.progress.files_changed, viewed.progress.files_changed) == (1, 0)
    assert rec.returned("search", content={"hits": ["FAILED x"]}).progress is None  # not text: not read
    assert rec.returned("bash", content="a.py b.py").progress is None  # text without a signal
    with StopClient(server.url, timeout=2.0) as client:
        client.decide("c-progress", rec.drain())
        client.outcome("c-progress", {"team": 0.0})
    logged = logged_trace(server, "c-progress").events
    assert logged[0].progress == run.progress and logged[1].progress == status.progress
    quiet = EventRecorder(progress=False)
    assert quiet.returned("bash", content=failing, exit_code=1).progress is None
    mine = {"tests_passed": 7, "source": "mine"}
    assert rec.returned("bash", content=failing, progress=mine).progress.tests_passed == 7  # type: ignore[union-attr]


def test_recorder_rejects_bad_event_with_field_named() -> None:
    rec = EventRecorder()
    with pytest.raises(TraceValidationError) as err:
        rec.record("spwan")
    assert "type" in str(err.value)
    assert rec.drain() == []
    assert rec.tool_use("ok").id.endswith("-1")  # the failed one used no id


def test_content_ref_of_structures_is_order_free() -> None:
    assert content_ref({"a": 1, "b": [1, 2]}) == content_ref({"b": [1, 2], "a": 1})
    assert content_ref(b"x") == content_ref("x")


# --------------------------------------------------------------------------- live service


def test_decide_and_outcome_against_real_server(server: LiveServer) -> None:
    rec = EventRecorder()
    with StopClient(server.url, safety={"max_turns": 3}, timeout=2.0) as client:
        assert client.model().kind == "none"
        decisions = []
        for i in range(10):
            d = client.decide(
                "c-live", step(rec, i), budget={"max_tokens": 10_000}, objective=Objective(lam=0.01)
            )
            decisions.append(d)
            if d.action == "stop":
                break
        assert [d.action for d in decisions] == ["continue", "continue", "stop"]
        last = decisions[-1]
        assert (last.reason, last.safety_net, last.limit, last.turn) == (
            "budget_exhausted",
            "max_turns",
            "turns",
            3,
        )
        assert last.finalize and not last.degraded
        out = client.outcome("c-live", {"team": 1.0}, stop={"reason": "budget_exhausted", "by": "safety_net"})
    assert out is not None and out.n_events == 6 and out.n_decisions == 3
    trace = logged_trace(server, "c-live")
    assert len(trace.events) == 6 and trace.rewards == {"team": 1.0}
    assert trace.stop is not None and trace.stop.reason == "budget_exhausted"


def test_retried_events_are_not_double_counted(server: LiveServer) -> None:
    rec = EventRecorder()
    events = step(rec, 0)
    with StopClient(server.url, timeout=2.0) as client:
        first = client.decide("c-retry", events)
        again = client.decide("c-retry", events)  # the orchestrator retries the same step
        assert first.turn == again.turn == 1
        assert client.state("c-retry").n_events == 2  # type: ignore[union-attr]
        out = client.outcome("c-retry", {"team": 0.0})
    assert out is not None and out.n_events == 2


def test_client_mistakes_raise_clear_errors(server: LiveServer) -> None:
    with StopClient(server.url, timeout=2.0) as client:
        with pytest.raises(ConfigError) as err:
            client.decide("c-bad", [], objective=Objective(lam=1e300))  # above the wire's cap
        assert "lambda" in str(err.value)
        with pytest.raises(TraceValidationError) as err2:
            client.decide("c-bad", [{"id": "e1", "t": 0, "type": "return"}])
        assert "events[0]" in str(err2.value) and "agent" in str(err2.value)
        with pytest.raises(ConfigError):
            client.decide("c-bad", [], safety={"max_turns": "many"})
        client.decide("c-closed", step(EventRecorder(), 0))
        client.outcome("c-closed", {"team": 1.0})
        with pytest.raises(RunClosedError):
            client.decide("c-closed", step(EventRecorder(), 1))


def test_a_service_trace_error_arrives_as_a_trace_error(server: LiveServer) -> None:
    # two clients share a run: the second's local state cannot see that its event goes back in time,
    # only the service can; its TraceValidationError must reach the caller as one, issues and all
    with StopClient(server.url, timeout=2.0) as first, StopClient(server.url, timeout=2.0) as second:
        first.decide("c-shared", [{"id": "a1", "t": 10.0, "type": "return", "agent": "a"}])
        with pytest.raises(TraceValidationError) as err:
            second.decide("c-shared", [{"id": "b1", "t": 1.0, "type": "return", "agent": "a"}])
    assert not isinstance(err.value, ConfigError)
    assert "out of time order" in err.value.message
    assert [i.path for i in err.value.issues] == ["events[0].t"]


def test_client_mistake_can_degrade_instead_of_raising(server: LiveServer) -> None:
    with StopClient(server.url, timeout=2.0, raise_on_client_error=False) as client:
        d = client.decide("c-soft", step(EventRecorder(), 0), objective=Objective(lam=1e300))
    assert d.degraded and d.action == "continue"


# --------------------------------------------------------------------------- fail safe


def test_unreachable_service_gives_degraded_safety_decisions() -> None:
    rec = EventRecorder()
    with StopClient(dead_url(), safety={"max_turns": 3}, timeout=0.1) as client:
        ds = [client.decide("c-dead", step(rec, i)) for i in range(3)]
        assert client.outcome("c-dead", {"team": 1.0}) is None  # not delivered, no exception
    assert all(d.degraded for d in ds)
    assert [d.action for d in ds] == ["continue", "continue", "stop"]
    assert (ds[-1].safety_net, ds[-1].reason, ds[-1].turn) == ("max_turns", "budget_exhausted", 3)


def test_degraded_decision_honours_proposed_stop_after_min_turns() -> None:
    rec = EventRecorder()
    with StopClient(dead_url(), safety={"min_turns": 2}, timeout=0.1) as client:
        early = client.decide("c-prop", step(rec, 0), proposed_stop=True)
        late = client.decide("c-prop", step(rec, 1), proposed_stop=True)
    assert early.action == "continue"  # vetoed before min_turns, as the service does
    assert late.action == "stop" and late.reason == "information_complete" and late.degraded


@pytest.mark.timeout(30)
def test_silent_service_times_out_to_local_decision() -> None:
    # a real listener that accepts connections and never answers
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        rec = EventRecorder()
        with StopClient(url, timeout=0.1, retries=1, safety={"max_turns": 2}) as client:
            first = client.decide("c-slow", step(rec, 0))
            second = client.decide("c-slow", step(rec, 1))
    assert first.degraded and second.degraded
    assert second.action == "stop" and second.safety_net == "max_turns"


def test_5xx_and_garbage_answers_degrade() -> None:
    answers = iter(
        [httpx.Response(503, json={"error": "busy"}), httpx.Response(200, text="<html>proxy</html>")]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        return next(answers, httpx.Response(500))

    with StopClient("http://stopserve", transport=httpx.MockTransport(handler), retries=1, cooldown=0) as c:
        d = c.decide("c-5xx", step(EventRecorder(), 0))
    assert d.degraded and d.action == "continue" and d.turn == 1


@pytest.mark.timeout(60)
def test_server_killed_mid_run_then_back(tmp_path: Path) -> None:
    """Kill -9 the service mid-run: degraded decisions; when it is back, unsent events are delivered."""
    rec = EventRecorder()
    srv = LiveServer(log_dir=tmp_path / "a", no_model=True).start()
    port = srv.port
    try:
        with StopClient(srv.url, timeout=2.0, cooldown=0.0, safety={"max_turns": 8}) as client:
            ok = [client.decide("c-kill", step(rec, i)) for i in range(2)]
            srv.kill()
            down = [client.decide("c-kill", step(rec, i)) for i in range(2, 4)]
            assert not any(d.degraded for d in ok) and all(d.degraded for d in down)
            assert [d.turn for d in ok + down] == [1, 2, 3, 4]
            # the same address comes back (a restarted sidecar): a fresh server, same port
            back = LiveServer(log_dir=tmp_path / "b", no_model=True)
            back.port, back.url = port, srv.url
            back.argv[back.argv.index("--port") + 1] = str(port)
            with back:
                d = client.decide("c-kill", step(rec, 4))
                assert not d.degraded
                # the new process does not hold the run (409 run_evicted): the client resent all of it
                assert d.events_accepted == 10 and d.turn == 5
                out = client.outcome("c-kill", {"team": 1.0})
                assert out is not None and out.n_events == 10
    finally:
        srv.stop()


def test_async_client_live_and_dead(server: LiveServer) -> None:
    async def main() -> tuple:
        rec = EventRecorder()
        async with AsyncStopClient(server.url, safety={"max_turns": 2}, timeout=2.0) as client:
            a = await client.decide("c-async", step(rec, 0))
            b = await client.decide("c-async", step(rec, 1))
            out = await client.outcome("c-async", {"team": 0.5})
        async with AsyncStopClient(dead_url(), safety={"max_turns": 1}, timeout=0.1) as dead:
            c = await dead.decide("c-async-dead", step(rec, 2))
        return a, b, out, c

    a, b, out, c = asyncio.run(main())
    assert (a.action, b.action, b.safety_net, a.degraded) == ("continue", "stop", "max_turns", False)
    assert out is not None and out.n_events == 4
    assert c.degraded and c.action == "stop"
    assert logged_trace(server, "c-async").rewards == {"team": 0.5}


def test_async_client_survives_a_new_event_loop(server: LiveServer) -> None:
    client = AsyncStopClient(server.url, timeout=2.0)
    rec = EventRecorder()
    first = asyncio.run(client.decide("c-loops", step(rec, 0)))
    second = asyncio.run(
        client.decide("c-loops", step(rec, 1))
    )  # a pool from the old loop must not be reused
    assert not first.degraded and not second.degraded and second.turn == 2


def test_sync_client_is_thread_safe(server: LiveServer) -> None:
    errors: list[BaseException] = []

    with StopClient(server.url, timeout=5.0) as client:

        def worker(k: int) -> None:
            try:
                rec = EventRecorder()
                for i in range(5):
                    d = client.decide(f"c-thread-{k}", step(rec, i))
                    assert d.turn == i + 1 and not d.degraded
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors


def test_decision_log_holds_every_decision(server: LiveServer) -> None:
    rec = EventRecorder()
    with StopClient(server.url, timeout=2.0) as client:
        got = [client.decide("c-log", step(rec, i)) for i in range(3)]
    lines = [orjson.loads(x) for x in (server.log_dir / "decisions.jsonl").read_bytes().splitlines() if x]
    mine = [x for x in lines if "c-log" in orjson.dumps(x).decode()]
    assert len(mine) >= len(got)


def test_undelivered_outcome_is_spooled_as_a_trace(tmp_path: Path) -> None:
    spool = tmp_path / "spool.jsonl"
    rec = EventRecorder()
    with StopClient(dead_url(), safety={"max_turns": 2}, timeout=0.1, spool=spool) as client:
        ds = [
            client.decide("c-spool", step(rec, i), task_id="task-9", budget={"max_turns": 5})
            for i in range(2)
        ]
        assert client.outcome("c-spool", {"team": 1.0}, stop={"reason": "budget_exhausted"}) is None
    (trace,) = list(read_traces(spool))
    assert (trace.trace_id, trace.task_id, trace.rewards) == ("c-spool", "task-9", {"team": 1.0})
    assert len(trace.events) == 4 and trace.stop is not None and trace.budget is not None
    decided = [e.decision for e in trace.events if e.decision is not None]
    assert [d.action for d in decided] == [d.action for d in ds] == ["continue", "stop"]
    assert trace.metrics["client_spooled"] == 1.0
    with pytest.raises(ConfigError):
        StopClient(dead_url(), spool=tmp_path / "spool.txt")


def test_delivered_outcome_is_not_spooled(server: LiveServer, tmp_path: Path) -> None:
    spool = tmp_path / "spool.jsonl"
    with StopClient(server.url, timeout=2.0, spool=spool) as client:
        client.decide("c-nospool", step(EventRecorder(), 0))
        assert client.outcome("c-nospool", {"team": 1.0}) is not None
    assert not spool.exists()


def test_an_evicted_run_is_resent_from_the_journal(tmp_path: Path) -> None:
    """The service drops the run (409 run_evicted): the client resends every event it sent, once."""
    rec = EventRecorder()
    env = {"STOPSERVE_MAX_RUNS": "1"}
    with (
        LiveServer(log_dir=tmp_path / "logs", no_model=True, env=env) as srv,
        StopClient(srv.url, timeout=5.0, safety={"max_turns": 5, "min_turns": 0}) as client,
    ):
        first = [client.decide("victim", step(rec, i)) for i in range(3)]
        assert [d.turn for d in first] == [1, 2, 3]
        other = httpx.post(srv.url + "/v1/runs/other/decide", json={})  # evicts the victim
        assert other.status_code == 200
        d = client.decide("victim", step(rec, 3))
        assert (d.turn, d.degraded, d.events_accepted) == (4, False, 8)
        d = client.decide("victim", step(rec, 4))
        assert (d.turn, d.action, d.limit) == (5, "stop", "turns")
        out = client.outcome("victim", {"team": 1.0})
        assert out is not None and out.n_events == 10
    (trace,) = [t for t in read_traces(tmp_path / "logs" / "traces.jsonl") if t.trace_id == "victim"]
    assert len(trace.events) == 10


def test_an_evicted_run_without_a_whole_journal_is_decided_locally(tmp_path: Path) -> None:
    rec = EventRecorder()
    env = {"STOPSERVE_MAX_RUNS": "1"}
    with (
        LiveServer(log_dir=tmp_path / "logs", no_model=True, env=env) as srv,
        StopClient(srv.url, timeout=5.0, safety={"max_turns": 5, "min_turns": 0}) as client,
    ):
        client._core.max_journal = 3  # the journal cannot hold the whole run
        for i in range(3):
            client.decide("v2", step(rec, i))
        httpx.post(srv.url + "/v1/runs/other/decide", json={})
        d = client.decide("v2", step(rec, 3))
        assert d.degraded and d.turn == 4  # the local state knows the real turn
        d = client.decide("v2", step(rec, 4))
        assert d.degraded and (d.turn, d.action) == (5, "stop")


# --------------------------------------------------------------------------- many events at once


def many_steps(rec: EventRecorder, n: int, offset: int = 0) -> list:
    for i in range(offset, offset + n):
        rec.tool_use("bash", content=f"cmd {i}", tokens=10)
        rec.returned("bash", content=f"out {i}")
    return rec.drain()


def test_a_decide_with_more_events_than_a_request_takes_is_split(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """1,800 events at once (above the old 1,000 pending bound) and 4,400 (above the service's 2,000
    per request): all delivered, the turn counts every one, nothing dropped, nothing degraded."""
    rec = EventRecorder()
    with StopClient(server.url, timeout=5.0, safety={"loop": False}) as client:
        d = client.decide("c-big", many_steps(rec, 900))
        assert (d.turn, d.degraded) == (900, False)
        d = client.decide("c-big", many_steps(rec, 1_300, offset=900))
        assert (d.turn, d.degraded) == (2_200, False)
        out = client.outcome("c-big", {"team": 1.0})
    assert out is not None and out.n_events == 4_400
    assert "dropped" not in caplog.text


def test_an_outcome_with_more_events_than_a_request_takes_is_delivered(server: LiveServer) -> None:
    rec = EventRecorder()
    with StopClient(server.url, timeout=5.0, safety={"loop": False}) as client:
        out = client.outcome("c-big-out", {"team": 1.0}, events=many_steps(rec, 1_500))
    assert out is not None and out.n_events == 3_000
    assert len(logged_trace(server, "c-big-out").events) == 3_000


def test_events_are_dropped_only_while_the_service_is_away_and_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec = EventRecorder()
    with StopClient(dead_url(), timeout=0.1, max_pending=50, safety={"loop": False}) as client:
        d = client.decide("c-away", many_steps(rec, 40))
        assert d.degraded and d.turn == 40
        assert "dropped 30 unsent events" in caplog.text and "decided locally" in caplog.text
        # the local state still holds every event; later decisions stay local and say so
        d = client.decide("c-away", many_steps(rec, 1, offset=40))
        assert d.degraded and d.turn == 41


def test_a_small_max_pending_drops_nothing_while_the_service_answers(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    with StopClient(server.url, timeout=5.0, max_pending=50, safety={"loop": False}) as client:
        d = client.decide("c-pending", many_steps(EventRecorder(), 40))
    assert (d.turn, d.degraded) == (40, False)
    assert "dropped" not in caplog.text


@pytest.mark.timeout(30)
def test_outcome_fails_as_fast_as_decide_once_the_breaker_is_open(tmp_path: Path) -> None:
    import time

    spool = tmp_path / "spool.jsonl"
    with socket.socket() as sock:  # accepts connections, never answers
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with StopClient(url, timeout=0.1, outcome_timeout=5.0, spool=spool) as client:
            assert client.decide("c-silent", step(EventRecorder(), 0)).degraded  # opens the breaker
            start = time.monotonic()
            assert client.outcome("c-silent", {"team": 1.0}) is None
            took = time.monotonic() - start
    assert took < 1.0, f"outcome waited {took:.2f} s on a service the breaker had given up on"
    (trace,) = list(read_traces(spool))
    assert trace.trace_id == "c-silent" and trace.rewards == {"team": 1.0}
