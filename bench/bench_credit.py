"""Message-level credit (issue 18) against the simulator's ground truth, and what it says on MINT.

Simulator: ``stopserve simulate`` makes 2,000 training and 1,000 fresh test runs (other
seeds); ``stopserve train`` fits the model (cost share 0.3, ``--cost-unit ktokens``); every
test run is credited (``stopserve.training.credit.credit_trace``, the code of ``stopserve
credit``) and compared with the simulator's offline label ``contribution`` (the true
quality change each return and aggregate caused, docs/simulator.md):

* Spearman rank correlation between an event's credit and its contribution, over the
  labelled events of one run (runs with fewer than 3 labelled events, or a constant label
  or credit, are left out and counted), averaged over runs: overall and per topology;
* the agent with the largest summed contribution is the agent with the largest summed
  credit, among the agents that carry a label (random guessing: 1 / their number; 1 / all
  the run's agents beside it);
* beside them, a reference that reads no model: the verifier's change of score from one
  reward to the next, shared over the round's returns and aggregate by tokens.

``--size full`` also repeats the simulator part at ``--noise 0`` (the grade is then the
verifier's score: nothing about the truth is hidden from a run) and credits MINT: the shared
MINT runs split by task into two halves, a model trained on each (``stopserve train``,
defaults), each half credited by the other half's model; the feedback agent's credit set
beside the success rates of the same models on the same tasks with and without feedback.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from _common import SHARED_DATA, Section, Target, fmt, parser
from _model import run, stopserve_cmd

SIZES = {  # train runs, test runs, MINT runs per half (0: no MINT)
    "tiny": (300, 40, 0),
    "quick": (600, 300, 0),
    "full": (2000, 1000, None),
}
SEEDS = (1801, 1802)
#: The credit variants measured: (label, credit_trace options).
VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("TD (defaults: window decision, split tokens, baseline zero)", {}),
    ("TD, window reward", {"window": "reward"}),
    ("TD, split equal", {"split": "equal"}),
    ("TD, baseline model", {"baseline": "model"}),
    ("TD, window reward, baseline model", {"window": "reward", "baseline": "model"}),
    ("ablation (every act, every decision point)", {"method": "ablation"}),
)
ORACLE = "reference: the verifier's change of score, by tokens (reads no model)"


def _train(traces: Path, out: Path, section: Section, *extra: str) -> Path | None:
    """``stopserve train``; None (and the section says why) when it ships a heuristic.

    A model already at ``out`` (a ``--workdir`` kept from an earlier run) is used as it is.
    """
    if (out / "manifest.json").is_file():
        print(f"reusing {out}", file=sys.stderr)
    else:
        run(stopserve_cmd("train", str(traces), "-o", str(out), "--no-progress", *extra), timeout=7200)
    manifest = json.loads((out / "manifest.json").read_text())
    if manifest["kind"] == "model":
        return out
    guard = manifest.get("guard", {})
    section.skip(
        f"`stopserve train {traces.name}` shipped the tuned heuristic "
        f"{(manifest.get('base_rule') or {}).get('name', manifest.get('rule_name'))!r} "
        f"(learned − heuristic {fmt(guard.get('difference'))} per run, 90% interval "
        f"{guard.get('difference_interval_90')}): "
        "credit reads the learned value, which this training did not ship"
    )
    return None


def _spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    return float(spearmanr(x, y).statistic)


def _oracle(trace: Any) -> dict[int, float]:
    """The verifier's change of score per round, shared over the round's returns and aggregate by tokens."""
    out: dict[int, float] = {}
    events, previous, start = trace.events, 0.0, 0
    for j, e in enumerate(events):
        if e.type != "reward" or e.value is None:
            continue
        body = [k for k in range(start, j) if events[k].type in ("return", "aggregate")]
        total = sum(events[k].tokens or 0 for k in body)
        for k in body:
            out[k] = (e.value - previous) * (events[k].tokens or 0) / total if total else 0.0
        previous, start = e.value, j + 1
    return out


class Score:
    """Per-run figures of one credit variant, kept by topology."""

    def __init__(self) -> None:
        self.rho: dict[str, list[float]] = defaultdict(list)
        self.rho_returns: dict[str, list[float]] = defaultdict(list)
        self.hit: dict[str, list[bool]] = defaultdict(list)
        self.hit_labelled: dict[str, list[bool]] = defaultdict(list)
        self.chance: dict[str, list[float]] = defaultdict(list)
        self.chance_all: dict[str, list[float]] = defaultdict(list)
        self.left_out = 0
        self.seconds = 0.0

    def add(self, topology: str, events: Sequence[Any], credit: Mapping[int, float | None]) -> None:
        labelled = [e for e in events if e.contribution is not None and credit.get(e.index) is not None]
        rho = _spearman([credit[e.index] for e in labelled], [e.contribution for e in labelled])  # type: ignore[misc]
        if rho is None:
            self.left_out += 1
        else:
            self.rho[topology].append(rho)
        returns = [e for e in labelled if e.type == "return"]
        rho_r = _spearman([credit[e.index] for e in returns], [e.contribution for e in returns])  # type: ignore[misc]
        if rho_r is not None:
            self.rho_returns[topology].append(rho_r)
        truth: dict[str, float] = defaultdict(float)
        given: dict[str, float] = defaultdict(float)
        given_labelled: dict[str, float] = defaultdict(float)  # credit of the labelled events only
        for e in events:
            c = credit.get(e.index)
            if e.contribution is not None:
                truth[e.agent] += e.contribution
                given_labelled[e.agent] += c or 0.0
            if c is not None:
                given[e.agent] += c
        if truth:
            top = max(truth, key=lambda a: truth[a])
            self.hit[topology].append(top == max(truth, key=lambda a: given.get(a, 0.0)))
            self.hit_labelled[topology].append(top == max(truth, key=lambda a: given_labelled[a]))
            self.chance[topology].append(1.0 / len(truth))
            self.chance_all[topology].append(1.0 / len({e.agent for e in events}))

    def summary(self) -> dict[str, Any]:
        def mean(d: Mapping[str, list[Any]], key: str | None = None) -> float:
            xs = [x for k, v in d.items() if key is None or k == key for x in v]
            return float(statistics.fmean(xs)) if xs else math.nan

        topologies = sorted(set(self.rho) | set(self.hit))
        return {
            "spearman": mean(self.rho),
            "spearman_returns": mean(self.rho_returns),
            "top_agent": mean(self.hit),
            "top_agent_labelled_events": mean(self.hit_labelled),
            "chance": mean(self.chance),
            "chance_all_agents": mean(self.chance_all),
            "runs_scored": sum(len(v) for v in self.rho.values()),
            "runs_left_out": self.left_out,
            "seconds": self.seconds,
            "by_topology": {
                t: {
                    "spearman": mean(self.rho, t),
                    "spearman_returns": mean(self.rho_returns, t),
                    "top_agent": mean(self.hit, t),
                    "chance": mean(self.chance, t),
                    "runs": len(self.rho.get(t, [])),
                }
                for t in topologies
            },
        }


def _simulator(work: Path, size: str, section: Section, noise: float | None) -> dict[str, Any] | None:
    from stopserve.policy import Policy
    from stopserve.trace import read_traces
    from stopserve.training.credit import credit_trace

    n_train, n_test, _ = SIZES[size]
    tag = "" if noise is None else f"-noise{noise:g}"
    files = {}
    for name, n, seed in (("train", n_train, SEEDS[0]), ("test", n_test, SEEDS[1])):
        files[name] = work / f"credit-sim-{name}{tag}.jsonl"
        args = ["simulate", "--n", str(n), "--seed", str(seed), "-o", str(files[name])]
        run(stopserve_cmd(*args, *([] if noise is None else ["--noise", f"{noise:g}"])), timeout=600)
    model = _train(files["train"], work / f"credit-sim-model{tag}", section, "--cost-unit", "ktokens")
    if model is None:
        return None
    policy = Policy.load(model)
    scores = {label: Score() for label, _ in VARIANTS}
    scores[ORACLE] = Score()
    for trace in read_traces(files["test"]):
        topology = trace.topology or "unknown"
        for label, options in VARIANTS:
            t0 = time.perf_counter()
            report = credit_trace(policy, trace, **options)
            scores[label].seconds += time.perf_counter() - t0
            scores[label].add(topology, report.events, {e.index: e.credit for e in report.events})
        scores[ORACLE].add(topology, report.events, _oracle(trace))
    manifest = json.loads((model / "manifest.json").read_text())
    return {
        "model": {
            "path": model.name,
            "method": manifest.get("method"),
            "version": manifest.get("model_version"),
            "cost_share": (manifest.get("objective") or {}).get("cost_share"),
            "lambda": (manifest.get("objective") or {}).get("lambda"),
        },
        "train": n_train,
        "test": n_test,
        "variants": {label: s.summary() for label, s in scores.items()},
    }


# --------------------------------------------------------------------------- MINT


def _task_half(task_id: str) -> int:
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % 2


def _mint(work: Path, section: Section) -> dict[str, Any] | None:
    from stopserve.policy import Policy
    from stopserve.trace import TraceWriter, read_traces
    from stopserve.training.credit import credit_trace

    source = SHARED_DATA / "mint-train"
    if not source.is_dir():
        section.skip(f"MINT: the shared data is absent ({source})")
        return None
    runs = work / "credit-mint.jsonl"
    proc = run(stopserve_cmd("import", "mint", str(source), "-o", str(runs), "--no-progress"), timeout=1800)
    print(proc.stdout.strip(), file=sys.stderr)
    halves = [work / "credit-mint-a.jsonl", work / "credit-mint-b.jsonl"]
    with TraceWriter(halves[0]) as a, TraceWriter(halves[1]) as b:
        for trace in read_traces(runs):
            (a, b)[_task_half(trace.task_id)].write(trace)
    models = [_train(h, work / f"credit-mint-model-{i}", section) for i, h in enumerate(halves)]
    if any(m is None for m in models):
        return None
    policies = [Policy.load(m) for m in models if m is not None]
    per_run: list[dict[str, Any]] = []
    for i, half in enumerate(halves):
        policy = policies[1 - i]  # each half credited by the model of the other half
        for trace in read_traces(half):
            per_run.append(_mint_run(policy, trace, credit_trace))
    return {"runs": per_run, "models": [m.name for m in models if m is not None]}


def _mint_run(policy: Any, trace: Any, credit_trace: Any) -> dict[str, Any]:
    # trace id mint/<model>/<F>/[<PHF>/]<task id without "mint/">; task id mint/<family>/<index...>
    model = trace.trace_id.split("/")[1]
    task_part = trace.task_id.removeprefix("mint/")
    setting = trace.trace_id.removeprefix(f"mint/{model}/").removesuffix(f"/{task_part}")
    feedback = next((e.agent for e in trace.events if e.agent.startswith("feedback:")), None)
    td = credit_trace(policy, trace)
    out: dict[str, Any] = {
        "model": model,
        "family": task_part.split("/")[0],
        "setting": setting,
        "task": trace.task_id,
        "success": float(trace.rewards.get("team", 0.0)),
        "two_agent": setting != "None",
        "n_feedback": 0,
    }
    credited = [e for e in td.events if e.credit is not None]
    out["credit_total"] = sum(e.credit for e in credited)
    if feedback is None:
        return out
    mine = [e for e in credited if e.agent == feedback]
    tokens = sum(e.tokens for e in credited)
    abl = credit_trace(policy, trace, method="ablation", types=["communicate"])
    fb_abl = [e.credit for e in abl.events if e.agent == feedback and e.credit is not None]
    out.update(
        n_feedback=len(mine),
        credit_feedback=sum(e.credit for e in mine),
        token_share_feedback=sum(e.tokens for e in mine) / tokens if tokens else math.nan,
        ablation_feedback=fb_abl,
    )
    return out


def _mint_groups(pairs: Sequence[Mapping[str, Any]], key: str) -> list[dict[str, Any]]:
    """Per value of ``key``: paired runs, success with and without feedback, the feedback's credit."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for p in pairs:
        groups[p[key]].append(p)
    out = []
    for name, members in groups.items():
        msgs = [x for p in members for x in p["ablation"]]
        out.append(
            {
                key: name,
                "paired": len(members),
                "with": statistics.fmean(p["with"] for p in members),
                "alone": statistics.fmean(p["alone"] for p in members),
                "difference": statistics.fmean(p["with"] - p["alone"] for p in members),
                "td_per_run": statistics.fmean(p["td"] for p in members),
                "ablation_per_message": statistics.fmean(msgs) if msgs else math.nan,
                "messages_positive": sum(x > 0 for x in msgs) / len(msgs) if msgs else math.nan,
            }
        )
    return sorted(out, key=lambda g: -g["paired"])


def _mint_tables(section: Section, data: Mapping[str, Any]) -> dict[str, Any]:
    from scipy.stats import spearmanr

    runs = data["runs"]
    two = [r for r in runs if r["n_feedback"] > 0]
    abl = [x for r in two for x in r["ablation_feedback"]]
    share_credit = [r["credit_feedback"] / r["credit_total"] for r in two if abs(r["credit_total"]) > 1e-9]
    # the data directly: the same model on the same task, with feedback and without
    alone: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in runs:
        if not r["two_agent"]:
            alone[(r["model"], r["task"])].append(r["success"])
    pairs = [
        {
            "setting": r["setting"],
            "family": r["family"],
            "model_setting": f"{r['model']} / {r['setting']}",
            "with": r["success"],
            "alone": statistics.fmean(alone[(r["model"], r["task"])]),
            "td": r["credit_feedback"],
            "ablation": r["ablation_feedback"],
        }
        for r in two
        if alone.get((r["model"], r["task"]))
    ]
    by_setting, by_family = _mint_groups(pairs, "setting"), _mint_groups(pairs, "family")
    # across (model, setting) groups: does the feedback's credit follow what feedback did to success?
    groups = [g for g in _mint_groups(pairs, "model_setting") if g["paired"] >= 30]
    diffs = [g["difference"] for g in groups]
    agree_abl = float(spearmanr([g["ablation_per_message"] for g in groups], diffs).statistic)
    agree_td = float(spearmanr([g["td_per_run"] for g in groups], diffs).statistic)
    summary = {
        "two_agent_runs": len(two),
        "one_agent_runs": sum(not r["two_agent"] for r in runs),
        "feedback_messages": len(abl),
        "td_credit_feedback_per_run": statistics.fmean(r["credit_feedback"] for r in two),
        "td_share_of_run_credit_median": statistics.median(share_credit) if share_credit else math.nan,
        "token_share_feedback_mean": statistics.fmean(r["token_share_feedback"] for r in two),
        "ablation_per_message_mean": statistics.fmean(abl) if abl else math.nan,
        "ablation_positive_share": sum(x > 0 for x in abl) / len(abl) if abl else math.nan,
        "paired_runs": len(pairs),
        "success_with_feedback": statistics.fmean(p["with"] for p in pairs),
        "success_alone_same_model_task": statistics.fmean(p["alone"] for p in pairs),
        "groups": len(groups),
        "groups_feedback_helped": sum(d > 0 for d in diffs),
        "spearman_groups_ablation_vs_direct": agree_abl,
        "spearman_groups_td_vs_direct": agree_td,
    }
    section.add(
        "",
        "### MINT: the feedback agent's messages",
        "",
        f"{summary['two_agent_runs']:,} two-agent runs with feedback messages and "
        f"{summary['one_agent_runs']:,} runs of a model alone; {summary['feedback_messages']:,} feedback "
        "messages. The runs are split by task into two halves; each half is credited by the model "
        f"`stopserve train` fitted on the other half ({', '.join(data['models'])}). TD: defaults. "
        "Ablation: `--types communicate`, the feedback agent's messages. Paired: a two-agent run and the "
        "runs of the same model on the same task alone (their mean success).",
        "",
        f"- TD credit of the feedback agent: {summary['td_credit_feedback_per_run']:+.4f} per run; its "
        f"median share of a run's credit {summary['td_share_of_run_credit_median']:.2f}, against a mean "
        f"token share of {summary['token_share_feedback_mean']:.2f} (TD shares each interval's change by "
        "tokens: within an interval it cannot tell the feedback from the model's action it came with).",
        f"- Ablation (the value with the message minus without it, net of its cost): "
        f"{summary['ablation_per_message_mean']:+.4f} per message; {summary['ablation_positive_share']:.0%} "
        "of messages positive.",
        f"- The data directly: {summary['paired_runs']:,} paired two-agent runs: success "
        f"{summary['success_with_feedback']:.3f} with feedback, "
        f"{summary['success_alone_same_model_task']:.3f} for the same model on the same task alone.",
        f"- Across the {summary['groups']} (model, feedback setting) groups with at least 30 paired runs "
        f"(feedback helped in {summary['groups_feedback_helped']}): Spearman between the success "
        f"difference and the ablation credit per message {fmt(agree_abl)}, and the TD credit per run "
        f"{fmt(agree_td)}.",
        "",
    )
    header = [
        "paired runs",
        "success with feedback",
        "same model & task alone",
        "difference",
        "TD credit of feedback / run",
        "ablation / message",
        "messages > 0",
    ]
    for key, rows in (("feedback setting (F/PHF)", by_setting), ("task family", by_family)):
        name = "setting" if key.startswith("feedback") else "family"
        section.table(
            [key, *header],
            [
                [
                    g[name],
                    g["paired"],
                    g["with"],
                    g["alone"],
                    f"{g['difference']:+.3f}",
                    f"{g['td_per_run']:+.4f}",
                    f"{g['ablation_per_message']:+.4f}",
                    f"{g['messages_positive']:.2f}",
                ]
                for g in rows
            ],
        )
    return {"summary": summary, "by_setting": by_setting, "by_family": by_family, "groups": groups}


# --------------------------------------------------------------------------- report


def _variant_table(section: Section, result: Mapping[str, Any]) -> None:
    rows = []
    for label, s in result["variants"].items():
        rows.append(
            [
                label,
                s["spearman"],
                s["spearman_returns"],
                s["top_agent"],
                s["top_agent_labelled_events"],
                s["chance"],
                s["chance_all_agents"],
                f"{s['runs_scored']:,} / {s['runs_left_out']:,}",
                s["seconds"],
            ]
        )
    section.table(
        [
            "credit",
            "Spearman (mean over runs)",
            "returns only",
            "top agent right",
            "… summing the labelled events' credit only",
            "chance (labelled agents)",
            "chance (all agents)",
            "runs scored / left out",
            "seconds",
        ],
        rows,
    )
    topologies = sorted(next(iter(result["variants"].values()))["by_topology"])
    chosen = [label for label, _ in VARIANTS[:2]] + [VARIANTS[-1][0], ORACLE]
    header = [
        "topology",
        *(f"{short}: Spearman / top agent" for short in ("TD", "TD reward", "ablation", "ref.")),
    ]
    body = []
    for t in topologies:
        cells = [t]
        for label in chosen:
            b = result["variants"][label]["by_topology"].get(t, {})
            cells.append(
                f"{fmt(b.get('spearman'))} / {fmt(b.get('top_agent'))} (chance {fmt(b.get('chance'))})"
            )
        body.append(cells)
    section.add("Per topology (TD: defaults; TD reward: `--window reward`):", "")
    section.table(header, body)


def _targets(section: Section, result: Mapping[str, Any], tag: str) -> None:
    v = result["variants"]
    td, tdr, abl = (v[label] for label in (VARIANTS[0][0], VARIANTS[1][0], VARIANTS[-1][0]))
    worst = min((b["spearman"], t) for t, b in td["by_topology"].items())
    for name, s in (("TD (defaults)", td), ("TD, window reward", tdr), ("ablation", abl)):
        section.targets.append(
            Target(
                f"{tag}Spearman(credit, contribution), mean over runs: {name}",
                f"{s['spearman']:.3f}",
                ">= 0.7",
                s["spearman"] >= 0.7,
            )
        )
    section.targets.append(
        Target(
            f"{tag}worst topology, TD (defaults): {worst[1]}", f"{worst[0]:.3f}", ">= 0.7", worst[0] >= 0.7
        )
    )
    for name, s in (("TD (defaults)", td), ("TD, window reward", tdr), ("ablation", abl)):
        section.targets.append(
            Target(
                f"{tag}top-contributing agent = top-credit agent: {name}",
                f"{s['top_agent']:.3f} (chance {s['chance']:.3f}; 1/all agents {s['chance_all_agents']:.3f})",
                ">= 0.8",
                s["top_agent"] >= 0.8,
            )
        )


def main() -> int:
    ap = parser(__doc__ or "")
    args = ap.parse_args()
    section = Section("Message-level credit (issue 18): simulator ground truth, MINT feedback", sys.argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="stopserve-credit-"))
    work.mkdir(parents=True, exist_ok=True)
    n_train, n_test, mint = SIZES[args.size]
    section.add(
        f"Simulator: {n_train:,} training runs (seed {SEEDS[0]}), {n_test:,} fresh test runs "
        f"(seed {SEEDS[1]}), "
        "`stopserve train --cost-unit ktokens` (cost share 0.3). The label sits on returns and aggregates: "
        "a round's level change shared by tokens, plus the answer's own deviation on the aggregate "
        "(docs/simulator.md); Spearman is over those events of a run.",
        "",
    )
    result = _simulator(work, args.size, section, None)
    if result is not None:
        m = result["model"]
        section.add(f"Model: `{m['version']}` (method {m['method']}, λ {fmt(m['lambda'])} per ktokens).", "")
        _variant_table(section, result)
        _targets(section, result, "")
        section.data["simulator"] = result
    if args.size == "full":
        noiseless = _simulator(work, args.size, section, 0.0)
        if noiseless is not None:
            section.add(
                "",
                "### The same at `--noise 0` (diagnostic: the grade is the verifier's score)",
                "",
                f"Model: `{noiseless['model']['version']}`.",
                "",
            )
            _variant_table(section, noiseless)
            section.data["simulator_noise0"] = noiseless
    if mint is None:
        mint_data = _mint(work, section)
        if mint_data is not None:
            section.data["mint"] = _mint_tables(section, mint_data)
    else:
        section.add("", f"- MINT: only at `--size full` (this run: `--size {args.size}`).")
    section.emit(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
