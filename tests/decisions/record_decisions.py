"""Record the shipped default model's decisions: the fixture ``test_default_decisions.py`` replays.

    python tests/decisions/record_decisions.py            # from the repository root, ../shared/data present

writes ``tests/decisions/default_decisions.json.gz``: every decision the shipped model
(``models/default``) makes, through ``Policy.decide``,

* at every step of every scenario of ``tests/scenarios/scenario_runs.py`` (driven to the
  scenario's limit, not cut at the first stop), every field of the answer; and the same
  through a live ``stopserve serve`` (HTTP, ``wire``): every field of each response;
* at every decision point of a fixed sample of the real runs of each corpus under
  ``../shared/data`` (imported by the project's importers; traces chosen by a hash of their
  id, about :data:`POINTS` decision points per corpus), the action, reason, rule, safety
  net, pattern, what became of a proposal and ``v_stop`` rounded to 6 decimals;

each under three objectives: the model's default, a cost share of 2 and λ 0.2 per
ktoken. The first recording was made with the code at commit 08c8a42 (before the
Manifest/Objective rework); a deliberate change of the shipped model or of a decision
rule regenerates it with this command, and the diff of the fixture is the review.
The corpora are the public runs described in ``../shared/data/README.md`` (mini-swe-agent
on SWE-bench Verified, MIT; MINT, Apache-2.0; InterCode, MIT); only trace ids and
decisions are stored, never their content.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
FIXTURE: Final = Path(__file__).with_name("default_decisions.json.gz")
SHARED: Final = ROOT.parent / "shared" / "data"
#: corpus -> (importer, source under ../shared/data)
CORPORA: Final[dict[str, tuple[str, str]]] = {
    "swe": ("mini-swe-agent", "swe-verified-gemini3-train"),
    "mint": ("mint", "mint-train"),
    "intercode": ("intercode", "intercode-train"),
}
#: Decision points sampled per corpus.
POINTS: Final = 2000
#: name -> objective keywords of Policy.decide (the model's default, a heavy share, a λ)
OBJECTIVES: Final[dict[str, dict[str, float]]] = {
    "default": {},
    "share2": {"cost_share": 2.0},
    "lambda0.2": {"lam": 0.2},
}
#: The fields of a StopDecision a scenario records (floats rounded).
SCENARIO_FIELDS: Final = (
    "action",
    "reason",
    "v_stop",
    "q_continue",
    "q_stop",
    "cost_to_go",
    "turn",
    "safety_net",
    "limit",
    "pattern",
    "finalize",
    "model_version",
    "propensity",
    "degraded",
    "rule",
    "message",
    "proposal",
    "explored",
)


def rounded(x: Any) -> Any:
    """A float rounded to 6 decimals (what is compared); anything else as it is."""
    return round(x, 6) if isinstance(x, float) else x


def decide(policy: Any, state: Any, objective: str, proposed: bool) -> Any:
    """``policy.decide`` under one of :data:`OBJECTIVES`, through the API of the code at hand."""
    kw = OBJECTIVES[objective]
    try:
        from stopserve.objective import Objective  # the API after the rework
    except ImportError:
        return policy.decide(state, proposed_stop=proposed, **kw)
    obj = None
    if "lam" in kw:
        obj = Objective(lam=kw["lam"])
    elif "cost_share" in kw:
        obj = Objective(cost_share=kw["cost_share"])
    return policy.decide(state, objective=obj, proposed_stop=proposed)


def compact(d: Any) -> list[Any]:
    """One corpus decision: ``[action, reason, rule, safety_net, pattern, proposal, v_stop]``."""
    v = None if d.v_stop is None else round(float(d.v_stop), 6)
    return [d.action, d.reason, d.rule, d.safety_net, d.pattern, d.proposal, v]


def scenario_decisions(policy: Any, only: str | None = None) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every scenario (or the one named ``only``), driven to its limit: every decision's fields."""
    sys.path.insert(0, str(ROOT / "tests" / "scenarios"))
    from scenario_runs import SCENARIOS

    from stopserve.features import RunState

    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name, scenario in SCENARIOS.items():
        if only is not None and name != only:
            continue
        out[name] = {}
        for objective in OBJECTIVES:
            steps = scenario.steps()
            state = RunState()
            answers = []
            for _ in range(scenario.limit):
                for event in next(steps):
                    state.fold(event)
                d = decide(policy, state, objective, False)
                answers.append({k: rounded(getattr(d, k)) for k in SCENARIO_FIELDS})
            out[name][objective] = answers
    return out


#: The request fields of each objective on the wire (``POST /v1/runs/{id}/decide``).
WIRE_OBJECTIVES: Final[dict[str, dict[str, float]]] = {
    "default": {},
    "share2": {"cost_share": 2.0},
    "lambda0.2": {"lambda": 0.2},
}


def wire_decisions(url: str, only: str | None = None) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every scenario through a live server's HTTP API: every answer but its run id, per objective."""
    import httpx

    sys.path.insert(0, str(ROOT / "tests" / "scenarios"))
    from scenario_runs import SCENARIOS

    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for name, scenario in SCENARIOS.items():
            if only is not None and name != only:
                continue
            out[name] = {}
            for objective, extra in WIRE_OBJECTIVES.items():
                run_id = f"wire-{name}-{objective}-{hashlib.sha256(url.encode()).hexdigest()[:6]}"
                steps = scenario.steps()
                answers = []
                for _ in range(scenario.limit):
                    body = {"events": [e.dump() for e in next(steps)], **extra}
                    response = client.post(f"/v1/runs/{run_id}/decide", json=body)
                    response.raise_for_status()
                    answer = response.json()
                    answer.pop("run_id")
                    answers.append({k: rounded(v) for k, v in answer.items()})
                client.delete(f"/v1/runs/{run_id}")
                out[name][objective] = answers
    return out


def _key(trace_id: str) -> str:
    return hashlib.sha256(trace_id.encode()).hexdigest()


def corpus_traces(corpus: str, ids: Sequence[str] | None = None) -> Iterator[Any]:
    """The corpus's traces, imported: those with ``ids`` (in that order), or all of them."""
    from stopserve.importers import IMPORTERS

    importer, source = CORPORA[corpus]
    traces = IMPORTERS[importer]([str(SHARED / source)], on_error=lambda _: None)
    if ids is None:
        yield from traces
        return
    wanted = set(ids)
    found = {t.trace_id: t for t in traces if t.trace_id in wanted}
    missing = [i for i in ids if i not in found]
    if missing:
        raise LookupError(f"{corpus}: {len(missing)} recorded traces not imported, e.g. {missing[:3]}")
    yield from (found[i] for i in ids)


def replay(policy: Any, trace: Any) -> dict[str, list[list[Any]]]:
    """Every decision point of ``trace`` under each objective (not cut at the first stop)."""
    from stopserve.features import RunState
    from stopserve.training.labels import fold_events

    out: dict[str, list[list[Any]]] = {o: [] for o in OBJECTIVES}
    state = RunState(topology=trace.topology, budget=trace.budget)
    for event, is_row in fold_events(trace, state):
        if is_row:
            proposed = event.type == "stop" and bool(event.proposed)
            for objective in OBJECTIVES:
                out[objective].append(compact(decide(policy, state, objective, proposed)))
    return out


def sample(corpus: str) -> list[Any]:
    """Traces of ``corpus`` in the order of a hash of their ids, up to :data:`POINTS` decision points."""
    from stopserve.trace import is_decision_point

    chosen: list[Any] = []
    points = 0
    for trace in sorted(corpus_traces(corpus), key=lambda t: _key(t.trace_id)):
        if points >= POINTS:
            break
        chosen.append(trace)
        points += max(1, sum(is_decision_point(e) for e in trace.events))
    return chosen


def model_files(model_dir: Path) -> dict[str, str]:
    """The sha256 of each booster file of a model directory: what identifies the model."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.glob("*.txt"))}


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from stopserve.policy import Policy

    model_dir = ROOT / "models" / "default"
    policy = Policy.load(model_dir)
    data: dict[str, Any] = {
        "about": (
            "decisions of the shipped default model (models/default); made by "
            "tests/decisions/record_decisions.py, replayed by tests/decisions/test_default_decisions.py"
        ),
        "model_version": policy.model_version,
        "model_files": model_files(model_dir),
        "objectives": OBJECTIVES,
        "corpus_fields": ["action", "reason", "rule", "safety_net", "pattern", "proposal", "v_stop"],
        "scenarios": scenario_decisions(policy),
        "wire": {},
        "corpora": {},
    }
    sys.path.insert(0, str(ROOT / "tests"))
    from servers import LiveServer

    with tempfile.TemporaryDirectory() as logs, LiveServer(log_dir=Path(logs)) as server:
        data["wire"] = wire_decisions(server.url)
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED}: not found; the corpora are recorded from the shared data")
    for corpus in CORPORA:
        traces = sample(corpus)
        data["corpora"][corpus] = {t.trace_id: replay(policy, t) for t in traces}
        n = sum(len(d["default"]) for d in data["corpora"][corpus].values())
        print(f"{corpus}: {len(traces)} traces, {n} decision points", file=sys.stderr)
    text = json.dumps(data, separators=(",", ":"), sort_keys=False)
    # a fixed mtime: the same decisions give the same bytes
    with FIXTURE.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
        fh.write(text.encode())
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
