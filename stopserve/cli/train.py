"""``stopserve train``, ``retrain``, ``rollback``, ``evaluate`` and ``credit``.

The trainer's options are generated from its parameter table
(:data:`stopserve.training.parameters.TRAINER_PARAMETERS`): the flags, their defaults and
help are declared there once, and the parsed values go back through
:class:`~stopserve.training.parameters.TrainerSettings`, which checks them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from stopserve.cli._args import (
    TRACES_HELP,
    add_parameters,
    cost_options,
    dask_options,
    fraction,
    group_option,
    label_options,
    no_progress,
    non_negative_float,
    non_negative_int,
    positive_int,
    share,
)
from stopserve.errors import ConfigError, TrainingError
from stopserve.training.parameters import TRAINER_PARAMETERS, TrainerSettings

__all__ = [
    "add_credit_parser",
    "add_train_parsers",
    "credit_command",
    "dask_backend",
    "evaluate_command",
    "fit_options",
    "logged_command",
    "retrain_command",
    "rollback_command",
    "train_command",
    "trainer_settings",
]


def fit_options(p: argparse.ArgumentParser) -> None:
    """The trainer's options (``train`` and ``retrain``), one per table entry."""
    add_parameters(p, TRAINER_PARAMETERS)


def trainer_settings(args: argparse.Namespace) -> TrainerSettings:
    """The trainer's settings the parsed options name."""
    return TrainerSettings(**{param.name: getattr(args, param.name) for param in TRAINER_PARAMETERS})


def add_train_parsers(sub: Any) -> None:
    """Add ``train``, ``retrain``, ``rollback`` and ``evaluate`` to ``sub``."""
    p = sub.add_parser(
        "train",
        help="learn a stop policy from traces and write a model directory",
        description="Learn a stop policy; it ships only when it beats the best tuned heuristic with "
        "error bars (docs/training.md). Every default is shown below.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACES", help=TRACES_HELP + " to learn from")
    p.add_argument("-o", "--output", required=True, metavar="MODEL_DIR", help="the model directory to write")
    fit_options(p)
    no_progress(p)
    dask_options(
        p, "featurize (one task per input file), fit the boosters and replay the policies on a Dask cluster"
    )
    label_options(p)

    p = sub.add_parser(
        "retrain",
        help="learn a model from the service's logs; promote it only if it beats the champion on new runs",
        description="Fit a candidate on the service's logged runs (and --corpus), judge it, the champion and "
        "the tuned heuristics off-policy on the most recent runs it did not train on, and promote the "
        "candidate or a heuristic only when the lower end of the 90% interval of (it - champion) is "
        "above 0, or its evidence carried over the rounds (a confidence sequence) is; the candidate "
        "refused last time is judged again on the runs logged since. Every "
        "promotion and refusal goes to the promotions log with its evidence (docs/retraining.md).",
    )
    p.add_argument(
        "--log-dir",
        metavar="DIR",
        default=None,
        help="the service's log directory (its traces.jsonl; STOPSERVE_LOG_DIR, default stopserve-logs)",
    )
    p.add_argument(
        "--model-store",
        metavar="DIR",
        help="where champions are kept (STOPSERVE_MODEL_STORE; default <log-dir>/models)",
    )
    p.add_argument(
        "--corpus", nargs="+", metavar="TRACES", help="earlier traces to learn from too (never judged on)"
    )
    p.add_argument(
        "--champion",
        metavar="DIR",
        help="the model served now (default: the store's champion, else STOPSERVE_MODEL_DIR, else the "
        "shipped default)",
    )
    p.add_argument(
        "--candidate",
        metavar="DIR",
        help="judge this model directory (one you trained) instead of fitting a candidate; only it may "
        "be promoted",
    )
    p.add_argument(
        "--holdout",
        type=fraction,
        default=0.3,
        help="share of the logged runs, the most recent, held out to judge on",
    )
    p.add_argument("--n-boot", type=positive_int, default=1000, help="bootstrap draws of the intervals")
    p.add_argument("--dry-run", action="store_true", help="judge the candidate, promote nothing, log nothing")
    p.add_argument("--json", action="store_true", help="print the evidence as one JSON object")
    p.add_argument(
        "--nice",
        type=non_negative_int,
        default=0,
        help="lower this process's priority by N; on Linux it then also runs as SCHED_IDLE, on CPU "
        "time nothing else wants (the service's background retrain uses 10)",
    )
    fit_options(p)
    no_progress(p)
    label_options(p)

    p = sub.add_parser("rollback", help="make the champion before the current one the champion again")
    p.add_argument("--log-dir", metavar="DIR", help="the service's log directory (default stopserve-logs)")
    p.add_argument(
        "--model-store",
        metavar="DIR",
        help="the model store (STOPSERVE_MODEL_STORE; default <log-dir>/models)",
    )

    p = sub.add_parser("evaluate", help="replay policies on held-out traces and compare them")
    p.add_argument("traces", nargs="+", metavar="TRACES", help=TRACES_HELP + " to judge on")
    p.add_argument("--model", required=True, metavar="DIR", help="the model directory (stopserve train -o)")
    p.add_argument("--tune-on", nargs="+", metavar="TRACES", help="traces to tune the heuristics on")
    cost_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="draw the success/cost Pareto chart")
    p.add_argument(
        "--logged",
        action="store_true",
        help="the traces are the service's logs, decided by another policy: estimate off-policy (IS and "
        "doubly robust, from the logged propensities) and say how many runs support each figure",
    )
    group_option(p, "bootstrap resampling unit and cross-fitting groups")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and the cross-fitting folds")
    dask_options(p, "featurize and replay on a Dask cluster, one task per input file")
    label_options(p)
    no_progress(p)


def add_credit_parser(sub: Any) -> None:
    """Add ``credit`` to ``sub``."""
    p = sub.add_parser(
        "credit",
        help="credit each event of a run with how much it moved the learned value (docs/credit.md)",
        description="Message-level credit from a trained model's value V = max(S, Q - lambda K): "
        "TD (the change of V between decision points, net of cost, split over the events between "
        "them) or ablation (the change of V when one event is removed and the run refolded).",
    )
    p.add_argument("traces", nargs="+", metavar="TRACES", help=TRACES_HELP)
    p.add_argument("--model", metavar="DIR", help="model directory (default: the shipped models/default)")
    p.add_argument(
        "--method",
        choices=("td", "ablation"),
        default="td",
        help="td: the change of V between decision points; ablation: V without each event. Default: td",
    )
    p.add_argument(
        "--split",
        choices=("tokens", "equal"),
        default="tokens",
        help="td: how an interval's value change is shared by its events. Default: tokens",
    )
    p.add_argument(
        "--window",
        choices=("decision", "reward"),
        default="decision",
        help="td: read V at every decision point, or only at rewards (where the run is scored) and "
        "the last decision point. Default: decision",
    )
    p.add_argument(
        "--baseline",
        choices=("zero", "model"),
        default="zero",
        help="V before the first event: 0 (nothing held or spent) or the model's value of the empty "
        "run. Default: zero",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument("--lambda", dest="lam", type=non_negative_float, help="absolute cost weight")
    group.add_argument("--cost-share", type=share, help="cost share (default: the model's)")
    p.add_argument(
        "--by",
        metavar="LIST",
        help="comma list of event, agent, role, type, agent-type. Default: event,agent for one "
        "trace, else agent,type",
    )
    p.add_argument("--trace", action="append", metavar="ID", help="only this trace id (repeatable)")
    p.add_argument(
        "--types", metavar="LIST", help="ablation: event types to remove (default: all but reward)"
    )
    p.add_argument(
        "--last-k", type=positive_int, metavar="K", help="ablation: only the last K decision points"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--csv", metavar="FILE.csv", help="write one row per event")
    p.add_argument("--plot", metavar="FILE.png", help="timeline of V and per-event credit (first trace)")
    p.add_argument("--limit", type=positive_int, default=30, help="rows per table (default 30)")
    p.add_argument("--limit-traces", type=positive_int, default=3, help="event tables shown (default 3)")
    no_progress(p)


def dask_backend(args: argparse.Namespace, *, progress: bool) -> Any:
    """The backend of a command's ``--dask`` and ``--dask-timeout`` (None without ``--dask``);
    the dashboard is told on stderr."""
    if getattr(args, "dask", None) is None:
        return None
    from stopserve.training.distributed import DaskBackend

    return DaskBackend.connect(
        args.dask, timeout=args.dask_timeout, progress=progress, log=lambda text: print(text, file=sys.stderr)
    )


def train_command(args: argparse.Namespace) -> int:
    """``stopserve train TRACES -o MODEL_DIR``: fit, guard, write the model directory, print a summary."""
    from stopserve.training.fit import PolicyLearner, print_summary

    progress = not args.no_progress
    settings = trainer_settings(args)
    backend = dask_backend(args, progress=progress)
    try:
        learner = PolicyLearner.from_settings(settings, progress=progress, backend=backend).fit(
            [str(p) for p in args.traces],
            cost_unit=args.cost_unit,
            labels_from_rewards=args.labels_from_rewards,
            group_by=settings.group_by,
        )
        out = learner.save(args.output)
    finally:
        if backend is not None:
            backend.close()
    print_summary(learner, out)
    return 0


def evaluate_command(args: argparse.Namespace) -> int:
    """``stopserve evaluate --model DIR TRACES... [--tune-on ...] [--lambda X | --cost-share S]``."""
    if getattr(args, "logged", False):
        return logged_command(args)
    from stopserve.objective import Objective
    from stopserve.policy import Policy
    from stopserve.training.evaluate import evaluate, plot_pareto, report_table
    from stopserve.training.replay import REPLAY_ENGINE

    policy = Policy.load(args.model, engine=REPLAY_ENGINE)
    manifest = policy.manifest
    model_unit = manifest.cost_unit
    if args.cost_unit and args.cost_unit != model_unit:
        # the model's lambda and cost-to-go are in its own unit: mixing units misprices every stop
        raise TrainingError(
            f"--cost-unit {args.cost_unit} differs from the model's cost unit {model_unit!r} "
            f"({args.model}/manifest.json); evaluate in {model_unit!r}"
        )
    labels_from_rewards = bool(args.labels_from_rewards or manifest.labels_from_rewards)
    progress = not args.no_progress  # on stderr, on a terminal only: --json output stays clean
    backend = dask_backend(args, progress=progress)
    try:
        report = evaluate(
            policy,
            [str(p) for p in args.traces],
            objective=Objective.of(args.lam, args.cost_share),
            tune_on=[str(p) for p in args.tune_on] if args.tune_on else None,
            cost_unit=args.cost_unit or model_unit,
            labels_from_rewards=labels_from_rewards,
            group_by=args.group_by,
            seed=args.seed,
            sweep=bool(args.plot),
            progress=progress,
            backend=backend,
        )
    finally:
        if backend is not None:
            backend.close()
    if args.plot:
        plot_pareto(report, args.plot)
    if args.json:
        print(json.dumps(report, allow_nan=False))
    else:
        print(report_table(report))
        if args.plot:
            print(f"chart written to {args.plot}")
    return 0


def retrain_command(args: argparse.Namespace) -> int:
    """``stopserve retrain``: fit, judge off-policy on the newest runs, promote or refuse (exit 0)."""
    if args.nice:
        os.nice(args.nice)
        if hasattr(os, "SCHED_IDLE"):  # Linux: run only on CPU the service leaves idle
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    from stopserve.training.retrain import RetrainOptions, logged_table, open_store, retrain
    from stopserve.training.sequential import describe

    options = RetrainOptions(
        trainer=trainer_settings(args),
        holdout=args.holdout,
        n_boot=args.n_boot,
        corpus=args.corpus or (),
        champion=args.champion,
        candidate=args.candidate,
        dry_run=args.dry_run,
        cost_unit=args.cost_unit,
        labels_from_rewards=args.labels_from_rewards,
        progress=not args.no_progress,
    )
    store, log_dir = open_store(args.log_dir, args.model_store)
    with store.lock():
        result = retrain(options, store=store, log_dir=log_dir, log=lambda text: print(text, file=sys.stderr))
        if result.evaluation is None and not args.dry_run:
            store.log({"kind": "refusal", "reason": result.reason, "evidence": result.evidence})
    if args.json:
        data = {"promoted": result.promoted, "reason": result.reason, **result.evidence}
        print(json.dumps(data, default=str))
    else:
        if result.evaluation is not None:
            lam = result.evidence.get("lambda")
            print(f"value per run at lambda {lam:.4g} per {result.evidence.get('cost_unit')}, off-policy:")
            print(logged_table(result.evaluation))
            if result.second_look is not None:
                look = result.evidence["second_look"]
                print(
                    f"the candidate refused last time ({look['candidate'].get('version')}), on the "
                    f"{look['judged_on']['runs']} runs logged since:"
                )
                print(logged_table(result.second_look))
            for who, seq in (
                ("candidate", result.evidence.get("sequential")),
                ("the candidate refused last time", result.evidence.get("second_look", {}).get("sequential")),
            ):
                if seq is not None and describe(seq) not in result.reason:  # else the reason says it
                    print(f"sequential evidence, {who} against the champion: {describe(seq)}")
        verdict = "PROMOTED" if result.promoted else "not promoted"
        where = f" -> {result.champion.path}" if result.champion is not None else ""
        print(f"{verdict}{' (dry run)' if args.dry_run else ''}: {result.reason}{where}")
    return 0


def logged_command(args: argparse.Namespace) -> int:
    """``stopserve evaluate --logged``: off-policy figures of a model on runs another policy decided.

    The traces are the service's logs (each decision with its propensity). The model, the
    runs as logged and, with ``--tune-on``, the tuned heuristics are each replayed through
    ``decide`` and estimated by IS and DR (:mod:`stopserve.training.offpolicy`), with 90%
    intervals over ``--group-by`` groups and the runs that support each figure.
    """
    if args.plot or getattr(args, "dask", None) is not None:
        raise ConfigError("evaluate --logged: --plot and --dask do not apply to off-policy figures")
    from stopserve.objective import Objective
    from stopserve.policy import Policy
    from stopserve.training.backend import TraceSource
    from stopserve.training.heuristics import tune_heuristics
    from stopserve.training.labels import build_decision_points
    from stopserve.training.offpolicy import logged_traces_ok
    from stopserve.training.replay import REPLAY_ENGINE
    from stopserve.training.retrain import evaluate_logged_runs, logged_table

    policy = Policy.load(args.model, engine=REPLAY_ENGINE)
    manifest = policy.manifest
    cost_unit = args.cost_unit or manifest.cost_unit
    labels = bool(args.labels_from_rewards or manifest.labels_from_rewards)
    paths = [str(p) for p in args.traces]
    dp = build_decision_points(
        iter(TraceSource(paths)), cost_unit=cost_unit, labels_from_rewards=labels, group_by=args.group_by
    )
    objective = policy.resolve(Objective.of(args.lam, args.cost_share))
    mean_cost = float(dp.trace_c_final.mean()) if dp.n_traces else 0.0
    lam = objective.lam_at(mean_cost)
    policies: dict[str, Policy] = {"model": policy}
    if args.tune_on:
        tune = build_decision_points(
            iter(TraceSource([str(p) for p in args.tune_on])),
            cost_unit=dp.cost_unit,
            labels_from_rewards=labels,
            group_by=args.group_by,
        )
        policies |= {f"heuristic {n}": h.policy() for n, h in tune_heuristics(tune, lam).items()}
    ev = evaluate_logged_runs(
        policies,
        paths,
        lam=lam,
        objective=objective,
        cost_unit=dp.cost_unit,
        labels_from_rewards=labels,
        group_by=args.group_by,
        seed=args.seed,
    )
    notes = list(logged_traces_ok(ev.dp))
    notes += [
        f"{name}: too few runs support its figure: {e.why}" for name, e in ev.estimates.items() if e.why
    ]
    if args.json:
        print(
            json.dumps({**ev.to_dict(), "runs": ev.dp.n_traces, "cost_unit": ev.dp.cost_unit, "notes": notes})
        )
        return 0
    explored = int((ev.dp.propensity < 1.0).sum())
    groups = len(set(ev.dp.group.tolist()))
    print(
        f"{ev.dp.n_traces} logged runs ({explored} decisions explored or explorable), value per run at "
        f"lambda {lam:.4g} per {ev.dp.cost_unit}, off-policy; 90% intervals over "
        f"{groups} {args.group_by} groups:"
    )
    print(logged_table(ev))
    for note in notes:
        print(f"NOTE: {note}")
    return 0


def rollback_command(args: argparse.Namespace) -> int:
    """``stopserve rollback``: the champion before the current one is the champion again."""
    from stopserve.training.retrain import open_store

    store, _ = open_store(args.log_dir, args.model_store)
    current = store.champion()
    champion = store.rollback()
    print(
        f"rolled back: {current.version if current else None} -> {champion.version} ({champion.path}); "
        "the service follows within a tick"
    )
    return 0


def credit_command(args: argparse.Namespace) -> int:
    """``stopserve credit TRACES [--model DIR] [--method td|ablation] ...``: tables, CSV, JSON, plot."""
    from stopserve.training.credit import credit_report

    return credit_report(
        args.traces,
        model=args.model,
        method=args.method,
        split=args.split,
        window=args.window,
        baseline=args.baseline,
        lam=args.lam,
        cost_share=args.cost_share,
        by=args.by,
        trace_ids=args.trace or (),
        types=args.types,
        last_k=args.last_k,
        as_json=args.json,
        csv=args.csv,
        plot=args.plot,
        limit=args.limit,
        limit_traces=args.limit_traces,
        show_progress=not args.no_progress,
    )
