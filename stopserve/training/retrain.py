"""``stopserve retrain`` and ``stopserve rollback``: a model of your own system, promoted on evidence.

A retrain reads the service's trace log (``<log_dir>/traces.jsonl`` and its rotated files,
oldest first), holds out the most recent share of the logged runs (``--holdout``; the most
recently *started*, as the service logs when each run started), and:

1. fits a candidate on the rest (and on ``--corpus``, earlier traces) with the trainer
   :class:`~stopserve.training.fit.PolicyLearner`, its options those of ``stopserve train``;
2. replays the candidate, the champion (the model served now) and every tuned heuristic
   (tuned on the training runs) through their own ``decide`` on the held-out runs, and
   estimates each one's value off-policy (:mod:`stopserve.training.offpolicy`: those runs
   were decided by the champion, and a policy that goes on where the champion stopped is
   judged through the explored runs, with its support counted);
3. promotes a challenger -- the candidate, or a tuned heuristic that beats it (not with
   ``--candidate``: then only that model) -- only when the lower end of the paired 90%
   interval of (challenger − champion), doubly robust, is above 0 (or it is never worse on
   any held-out run and better on some) and both figures are supported; the candidate
   before a heuristic unless the heuristic is better than it too. Otherwise says why.
   Either way one line goes to the promotions log
   (:class:`stopserve.model_store.ModelStore`) with the evidence;
4. gives the candidate the last retrain refused (kept in the store, and with exploration on
   shadowed by the service, which explored where it would go on) a **second look**: the
   same gate on the runs logged since its refusal, which it has neither trained nor been
   judged on. When it passes and the fitted candidate does not, it is promoted, before a
   tuned heuristic (not with ``--candidate``). A refused candidate replaces the kept one,
   unless the kept one's sequential evidence is the stronger;
5. keeps the **sequential evidence** of the candidate judged round after round (the kept one,
   or ``--candidate``'s) against the champion, in the store's ``sequential.json``: each round's
   held-out runs not counted before add their paired DR differences to a confidence sequence
   (:mod:`stopserve.training.sequential`), and a candidate no round's interval shows better is
   promoted once the sequence does; the evidence says which decided (``decided_by``).

The promoted model is compiled here (into the inference cache the service reads), copied
into the model store and becomes its champion; every
service process that reads the store serves it within a tick. ``stopserve rollback``
restores the champion before it. One retrain runs at a time per store (a lock).
"""

from __future__ import annotations

import hashlib
import math
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import orjson

from stopserve.artifacts import save_model_dir
from stopserve.errors import ConfigError, TrainingError
from stopserve.model_store import Champion, KeptCandidate, ModelStore
from stopserve.objective import DEFAULT_OBJECTIVE, Objective
from stopserve.policy import Policy
from stopserve.service.log import log_files
from stopserve.settings import default_model_dir, load_settings
from stopserve.training.backend import TraceSource
from stopserve.training.fit import PolicyLearner, model_version
from stopserve.training.heuristics import TunedHeuristic, tune_heuristics
from stopserve.training.labels import build_decision_points
from stopserve.training.offpolicy import MIN_RUNS, LoggedEvaluation, evaluate_logged, supported_at_any_count
from stopserve.training.parameters import TrainerSettings
from stopserve.training.replay import REPLAY_ENGINE, replay_decide
from stopserve.training.sequential import Evidence, describe

__all__ = [
    "Judgement",
    "RetrainOptions",
    "RetrainResult",
    "evaluate_logged_runs",
    "judge",
    "logged_runs",
    "logged_table",
    "open_store",
    "recency_order",
    "retrain",
]

#: Fewer logged runs than this to train on: no candidate is fitted.
MIN_TRAIN_RUNS: Final = 20
#: The estimator the promotion gate reads.
GATE_ESTIMATOR: Final = "dr"
#: The promoted policy's name when the refused candidate passes its second look.
KEPT: Final = "kept candidate"
#: The manifest fields that say how a policy weighs cost (a promoted heuristic keeps the candidate's).
_PRICING: Final = ("cost_unit", "cost_scale", "objective")


@dataclass
class RetrainResult:
    """What a retrain did: promoted or not, why, and the evidence (what the promotions log holds)."""

    promoted: bool
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    champion: Champion | None = None
    evaluation: LoggedEvaluation | None = None
    #: the refused candidate's second look, on the runs logged since its refusal (None: none)
    second_look: LoggedEvaluation | None = None


def logged_runs(log_dir: Path) -> list[Path]:
    """The service's trace log files, oldest first (rotated ones, then ``traces.jsonl``)."""
    return log_files(log_dir / "traces.jsonl")


def _lines(paths: Sequence[Path]) -> Iterator[bytes]:
    """The whole lines of JSON Lines files, in order (a line still being written is left out)."""
    for path in paths:
        with path.open("rb") as fh:
            for line in fh:
                if line.endswith(b"\n") and line.strip():
                    yield line


def _ends(path: Path) -> tuple[str | None, str | None]:
    """The trace ids of the first and the last run in a JSON Lines file, in its order."""
    first = last = None
    for line in _lines([path]):
        last = str(orjson.loads(line).get("trace_id"))
        first = first or last
    return first, last


@dataclass(frozen=True)
class _Split:
    """The logged runs a retrain reads, written to its work directory (see :func:`_split`)."""

    train: Path
    held: Path
    n_train: int
    n_hold: int
    #: the objectives the runs were decided at (``service_lambda`` / ``service_cost_share``)
    objectives: set[tuple[str, float]]
    #: what "most recent" was read from: ``started`` or ``logged``
    by: str
    #: the trace id of the last run in the log (what a candidate refused now has seen)
    last_id: str | None
    #: the runs logged after ``after`` (the kept candidate's second look), None when it is not in the log
    since: Path | None
    n_since: int


def _split(paths: Sequence[Path], holdout: float, work: Path, after: str | None = None) -> _Split:
    """Write the logged runs to ``work/train.jsonl`` and their most recent ``holdout`` share to
    ``work/holdout.jsonl``, and the runs logged after the one whose trace id is ``after`` (its
    last occurrence) to ``work/since.jsonl``.

    Most recent by when each run started (``metrics.service_started``, which the service writes)
    when every run says so, else by when it was logged: runs end in the order of their length
    when many run at once, so the last to finish are the longest, not a fair sample of the recent.
    "Logged after" is the log's own order: every run that finished since, however long.
    """
    lines = list(_lines(paths))
    n = len(lines)
    n_hold = math.ceil(holdout * n) if n else 0
    objectives: set[tuple[str, float]] = set()
    parsed = [orjson.loads(line) for line in lines]
    metrics = [d.get("metrics") or {} for d in parsed]
    ids = [str(d.get("trace_id")) for d in parsed]
    for m in metrics:
        for key in ("service_lambda", "service_cost_share"):
            if key in m:
                objectives.add((key, float(m[key])))
    keys = [
        (tid, hashlib.sha256(orjson.dumps(d, option=orjson.OPT_SORT_KEYS)).hexdigest())
        for tid, d in zip(ids, parsed, strict=True)
    ]
    order, by = recency_order(metrics, keys)
    train, held = work / "train.jsonl", work / "holdout.jsonl"
    with train.open("wb") as a, held.open("wb") as b:
        for rank, i in enumerate(order):
            (a if rank < n - n_hold else b).write(lines[i])
    since: Path | None = None
    n_since = 0
    if after is not None and after in ids:
        first = n - ids[::-1].index(after)
        since = work / "since.jsonl"
        since.write_bytes(b"".join(lines[first:]))
        n_since = n - first
    return _Split(train, held, n - n_hold, n_hold, objectives, by, ids[-1] if ids else None, since, n_since)


def recency_order(
    metrics: Sequence[Mapping[str, Any]], keys: Sequence[tuple[str, str]] | None = None
) -> tuple[list[int], str]:
    """The logged runs (their ``metrics``, in log order) from oldest to most recent, and by what.

    By when each run started (``service_started``) when every run says so (``"started"``), else
    by when it was logged (``"logged"``). The last ``holdout`` share of this order is judged on.
    Runs that started at the same time are ordered by ``keys`` (trace id, content digest: as
    training orders traces), else by their place in the log.
    """
    started = [v for m in metrics if isinstance(v := m.get("service_started"), int | float)]
    if not metrics or len(started) < len(metrics):
        return list(range(len(metrics))), "logged"
    tie = keys if keys is not None else [("", "")] * len(metrics)
    return sorted(range(len(metrics)), key=lambda i: (float(started[i]), tie[i], i)), "started"


def _objective(trainer: TrainerSettings, objectives: set[tuple[str, float]]) -> tuple[TrainerSettings, str]:
    """``trainer`` with the logged runs' cost weight when it names none, and where that was read."""
    if trainer.lam is not None or trainer.cost_share is not None:
        return trainer, "given"
    if not objectives:
        return trainer, "the trainer's default (the runs carry no service_lambda or service_cost_share)"
    if len(objectives) > 1:
        seen = ", ".join(f"{k.removeprefix('service_')} {v:g}" for k, v in sorted(objectives))
        raise ConfigError(
            f"the logged runs were decided at several cost weights ({seen}): give lam or cost_share "
            "(--lambda or --cost-share)"
        )
    ((key, value),) = objectives
    logged = replace(trainer, lam=value) if key == "service_lambda" else replace(trainer, cost_share=value)
    return logged, f"the logged runs' {key.removeprefix('service_').replace('_', ' ')} {value:g}"


def _champion_dir(store: ModelStore, given: str | None) -> tuple[Path | None, str]:
    """The model served now, and where that was read: ``--champion``, the store, the settings."""
    if given:
        return Path(given), "--champion"
    champion = store.champion()
    if champion is not None:
        return champion.path, f"the champion of {store.root}"
    configured = load_settings().resolved_model_dir()
    return configured, "STOPSERVE_MODEL_DIR" if configured != default_model_dir() else "the shipped default"


@dataclass(frozen=True, kw_only=True)
class RetrainOptions:
    """What one retrain is asked (``stopserve retrain``'s options, typed)."""

    #: the candidate's fit (``cost_scale`` must be fixed: a model of the system it served)
    trainer: TrainerSettings
    #: share of the logged runs, the most recent, held out to judge on
    holdout: float
    #: bootstrap draws of the intervals
    n_boot: int
    #: earlier trace files to learn from too (never judged on)
    corpus: Sequence[str] = ()
    #: the model served now (None: the store's champion, else the settings' model)
    champion: str | None = None
    #: judge this model directory instead of fitting a candidate (only it may be promoted)
    candidate: str | None = None
    #: judge, promote nothing, log nothing
    dry_run: bool = False
    cost_unit: str | None = None
    labels_from_rewards: bool = False
    progress: bool = False


def retrain(
    options: RetrainOptions,
    *,
    store: ModelStore,
    log_dir: Path,
    log: Any = None,
) -> RetrainResult:
    """One retrain (see the module docstring); promotes unless ``options.dry_run``."""
    say = log if log is not None else (lambda text: None)
    t0 = time.perf_counter()
    if options.trainer.cost_scale != "fixed":
        raise ConfigError(
            "retrain learns a model of the system it served: cost_scale fixed "
            "(--cost-scale fixed, the default)"
        )
    files = logged_runs(log_dir)
    if not files:
        raise TrainingError(f"{log_dir}: no trace log (traces.jsonl): the service has logged no finished run")
    work = store.root / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    kept = None if options.candidate else store.kept_candidate()
    split = _split(files, options.holdout, work, after=kept.seen_through if kept is not None else None)
    train, held, n_train, n_hold, recent = split.train, split.held, split.n_train, split.n_hold, split.by
    trainer, objective = _objective(options.trainer, split.objectives)
    corpus = [Path(p) for p in (options.corpus or [])]
    champion_dir, champion_from = _champion_dir(store, options.champion)
    base: dict[str, Any] = {
        "log_dir": str(log_dir),
        "trained_on": {"logged_runs": n_train, "corpus": [str(p) for p in corpus]},
        "judged_on": {"runs": n_hold, "holdout": options.holdout, "most_recently": recent},
        "objective": {"lambda": trainer.lam, "cost_share": trainer.cost_share, "from": objective},
        "champion": {"path": None if champion_dir is None else str(champion_dir), "from": champion_from},
    }
    if n_hold < MIN_RUNS or n_train < MIN_TRAIN_RUNS:
        return RetrainResult(
            False,
            f"too few logged runs: {n_train} to train on and {n_hold} to judge on (at least {MIN_TRAIN_RUNS} "
            f"and {MIN_RUNS}); the champion stays",
            base,
        )
    say(f"retrain: {n_train} logged runs to train on (+ {len(corpus)} corpus files), {n_hold} to judge on")
    t_fit = time.perf_counter()
    trained_on = [str(p) for p in (*corpus, train)]
    guard: dict[str, Any] | None = None
    best: str | None = None
    if options.candidate:
        candidate_dir = Path(options.candidate)
        # a model prices cost in its own unit: judge it in that unit unless told otherwise
        unit = Policy.load(candidate_dir, engine=REPLAY_ENGINE).cost_unit
        train_dp = build_decision_points(
            iter(TraceSource(trained_on)),
            cost_unit=options.cost_unit or unit,
            labels_from_rewards=options.labels_from_rewards,
            group_by=trainer.group_by,
        )
        mean_cost = float(train_dp.trace_c_final.mean())
        lam = (Objective.of(trainer.lam, trainer.cost_share) or DEFAULT_OBJECTIVE).lam_at(mean_cost)
    else:
        learner: PolicyLearner = PolicyLearner.from_settings(trainer, progress=options.progress)
        learner.fit(
            trained_on,
            cost_unit=options.cost_unit,
            labels_from_rewards=options.labels_from_rewards,
            group_by=trainer.group_by,
        )
        candidate_dir = learner.save(work / "candidate")
        train_dp, lam = learner.dp_, float(learner.cv_["lambda"])
        guard, best = learner.guard_, f"heuristic {learner.cv_['best_heuristic']}"
    fit_s = time.perf_counter() - t_fit
    candidate = Policy.load(candidate_dir, engine=REPLAY_ENGINE)
    champion = (
        Policy.load(champion_dir, engine=REPLAY_ENGINE) if champion_dir is not None else Policy.safety_only()
    )
    t_eval = time.perf_counter()
    tuned = {f"heuristic {n}": h for n, h in tune_heuristics(train_dp, lam).items()}
    heuristics = {name: h.policy() for name, h in tuned.items()}
    # each policy replayed as the service serves it: with the cost weight the runs are decided at
    asked = Objective.of(trainer.lam, trainer.cost_share) or DEFAULT_OBJECTIVE
    stored = Evidence.from_dict(raw) if (raw := store.sequential()) is not None else None
    # the evidence kept is about the refused candidate kept, when one is (its second look adds to
    # it); a fitted candidate is new, and starts from nothing
    sequence = _evidence_for(
        stored if kept is None else None, champion.model_version, candidate.model_version
    )
    verdict = judge(
        candidate,
        champion,
        held,
        lam=lam,
        objective=asked,
        heuristics=heuristics,
        heuristics_compete=not options.candidate,
        cost_unit=train_dp.cost_unit,
        labels_from_rewards=options.labels_from_rewards,
        group_by=trainer.group_by,
        n_boot=options.n_boot,
        seed=trainer.seed,
        sequence=sequence,
    )
    eval_s = time.perf_counter() - t_eval
    ev = verdict.evaluation
    evidence = {
        **base,
        **verdict.evidence,
        "judged_on": {**base["judged_on"], **verdict.evidence["judged_on"]},
        "candidate": {
            "path": str(candidate_dir) if options.candidate else None,
            "version": candidate.model_version,
            "kind": candidate.kind,
            "guard": guard,
        },
        "champion": {**base["champion"], "version": champion.model_version, "kind": champion.kind},
        "best_heuristic": best,
        "timings": {"fit_s": fit_s, "evaluate_s": eval_s, "total_s": time.perf_counter() - t0},
    }
    promoted, reason = verdict.promoted, verdict.reason
    winner_dir, winner = candidate_dir, candidate
    if verdict.winner is not None and verdict.winner != "candidate":
        winner_dir = _heuristic_dir(tuned[verdict.winner], candidate, work / "heuristic")
        winner = Policy.load(winner_dir, engine=REPLAY_ENGINE)
    second: Judgement | None = None
    if kept is not None:
        t_second = time.perf_counter()
        second, look = _second_look(
            kept,
            champion,
            split,
            lam=lam,
            objective=asked,
            cost_unit=train_dp.cost_unit,
            options=options,
            trainer=trainer,
            stored=stored,
        )
        evidence["second_look"] = look
        evidence["timings"]["second_look_s"] = time.perf_counter() - t_second
        # a fitted model before a tuned heuristic: the refused candidate passing its second look
        # is promoted unless the fitted candidate is
        if verdict.winner != "candidate" and second is not None and second.promoted:
            promoted, winner_dir = True, kept.path
            winner = Policy.load(winner_dir, engine=REPLAY_ENGINE)
            reason = (
                f"the candidate refused last time ({winner.model_version}), judged again on the "
                f"{look['judged_on']['runs']} runs logged since: {second.reason}; on the held-out runs: "
                f"{verdict.reason}"
            )
            evidence["winner"] = KEPT
            evidence["decided_by"] = second.decided_by
            evidence["difference"] = {**look["difference"], "policy": KEPT}
        elif not promoted:
            reason += f"; the candidate refused last time: {look.get('reason') or look.get('skipped')}"
    # of two refused candidates the one with the stronger sequential evidence stays kept (and
    # shadowed, and judged again next time): a newly fitted one replaces the kept one unless the
    # kept one's evidence, gathered over its rounds, is the stronger now (its capital: a peak
    # that has since decayed is no evidence left)
    keep_old = (
        not promoted
        and second is not None
        and second.sequence is not None
        and second.sequence.capital > sequence.capital
    )
    if keep_old:
        assert second is not None and second.sequence is not None
        reason += (
            f"; the candidate refused last time stays kept: its sequential evidence (capital "
            f"{second.sequence.capital:.3g}) is stronger than this candidate's ({sequence.capital:.3g})"
        )
        evidence["kept"] = "the candidate refused last time"
    if promoted:
        evidence["promoted_policy"] = {"policy": evidence["winner"], "version": winner.model_version}
    result = RetrainResult(
        promoted, reason, evidence, evaluation=ev, second_look=None if second is None else second.evaluation
    )
    if options.dry_run:
        return result
    # compiled here, at this process's priority, into the cache the service reads: its load of the
    # new champion (or, with exploration on, of the refused candidate it shadows) is then a cache
    # hit, not a compiler run beside its decide calls
    Policy.load(winner_dir if promoted else kept.path if keep_old and kept is not None else candidate_dir)
    if promoted:
        assert winner.model_version is not None
        result.champion = store.promote(
            winner_dir,
            version=winner.model_version,
            previous={"version": champion.model_version, "path": champion_dir}
            if champion_dir is not None
            else None,
            evidence={**evidence, "reason": reason},
        )
    elif keep_old:
        assert kept is not None and second is not None and second.sequence is not None
        store.candidate_seen_through(split.last_id)
        store.save_sequential(second.sequence.to_dict())
        # ``candidate``: the one judged (in the work directory until the next retrain), as in every refusal
        record = {"kind": "refusal", "candidate": str(candidate_dir), "kept": str(kept.path)}
        store.log({**record, "reason": reason, "evidence": evidence})
    else:
        first_look = {**verdict.evidence["difference"], "enough": ev.estimates["candidate"].enough}
        kept_at = store.keep_candidate(candidate_dir, seen_through=split.last_id, first_look=first_look)
        store.save_sequential(sequence.to_dict())
        store.log({"kind": "refusal", "candidate": str(kept_at), "reason": reason, "evidence": evidence})
    return result


def _evidence_for(stored: Evidence | None, champion: str | None, candidate: str | None) -> Evidence:
    """The sequential evidence kept about ``candidate`` against ``champion``, else none yet.

    A change of either starts it anew: the runs a new champion logs, or a new candidate's
    figures, are another experiment.
    """
    if stored is not None and stored.matches(champion, candidate):
        return stored
    return Evidence.start(champion, candidate)


def _second_look(
    kept: KeptCandidate,
    champion: Policy,
    split: _Split,
    *,
    lam: float,
    objective: Objective,
    cost_unit: str | None,
    options: RetrainOptions,
    trainer: TrainerSettings,
    stored: Evidence | None,
) -> tuple[Judgement | None, dict[str, Any]]:
    """The refused candidate judged again, against the champion, on the runs logged since.

    Those runs are new to it (neither trained nor judged on), and with exploration on the
    service explored where it would go on past the champion's stops, so they support the
    figure its first look lacked. Given also to a candidate its first look found worse: those
    runs are independent of the first look's, which can be wrong (on the deployment simulator a
    candidate +0.016 better in truth read -0.0089 [-0.018, -0.0018] on its first).
    Its sequential evidence against this champion (``stored``, when it is about it) gathers
    these runs too. Returns the judgement (None: skipped) and its evidence.
    """
    look: dict[str, Any] = {"candidate": {"path": str(kept.path)}, "first_look": kept.first_look}
    if kept.seen_through is None:
        look["skipped"] = "it was kept without the runs its refusal saw: not judged again"
        return None, look
    if split.since is None:
        look["skipped"] = f"the last run its refusal saw ({kept.seen_through}) is no longer in the log"
        return None, look
    policy = Policy.load(kept.path, engine=REPLAY_ENGINE)
    look["candidate"]["version"] = policy.model_version
    verdict = judge(
        policy,
        champion,
        split.since,
        lam=lam,
        objective=objective,
        cost_unit=cost_unit,
        labels_from_rewards=options.labels_from_rewards,
        group_by=trainer.group_by,
        n_boot=options.n_boot,
        seed=trainer.seed,
        sequence=_evidence_for(stored, champion.model_version, policy.model_version),
    )
    look.update(verdict.evidence)
    look["judged_on"] = {"runs": split.n_since, "after": kept.seen_through, **verdict.evidence["judged_on"]}
    look["reason"] = verdict.reason
    return verdict, look


def _heuristic_dir(heuristic: TunedHeuristic, candidate: Policy, out: Path) -> Path:
    """A tuned heuristic as a model directory, priced as the candidate was (what the gate judged)."""
    priced = candidate.manifest
    manifest = heuristic.manifest().updated(
        **{k: getattr(priced, k) for k in _PRICING},
        method="heuristic",
        training_data=priced.training_data or {},
        promoted_by="stopserve retrain: a tuned heuristic beat the champion and the fitted candidate",
    )
    return save_model_dir(out, manifest.updated(model_version=model_version(manifest)))


def evaluate_logged_runs(
    policies: Mapping[str, Policy],
    paths: Sequence[str | Path],
    *,
    lam: float,
    objective: Objective,
    cost_unit: str | None = None,
    labels_from_rewards: bool = False,
    group_by: str = "task",
    n_boot: int = 1000,
    seed: int = 0,
) -> LoggedEvaluation:
    """IS and DR figures of ``policies`` on the logged runs in ``paths``, each replayed as served.

    Every policy decides through its own ``decide`` with ``objective`` (as the service is
    asked); values are ``q − lam·c``; intervals resample
    whole ``group_by`` groups; a policy's DR model part is its own (none for a tuned heuristic).
    """
    source = TraceSource(list(paths))
    dp = build_decision_points(
        iter(source), cost_unit=cost_unit, labels_from_rewards=labels_from_rewards, group_by=group_by
    )
    order = list(policies)
    stops = replay_decide(
        iter(source),
        dp,
        lambda i: [policies[n] for n in order],
        objective=objective,
    )
    return evaluate_logged(
        policies,
        dp,
        {n: stops[j] for j, n in enumerate(order)},
        lam=lam,
        groups=dp.group,
        n_boot=n_boot,
        seed=seed,
    )


@dataclass(frozen=True)
class Judgement:
    """The promotion gate's answer, its reason in words and the off-policy figures behind it.

    ``winner``: the challenger promoted (``candidate`` or ``heuristic <name>``), None when
    none is. ``decided_by``: what promoted it, ``interval`` (this round's paired 90%
    interval, or its runs' dominance) or ``sequence`` (the candidate's sequential evidence
    over the rounds, :mod:`stopserve.training.sequential`). ``sequence``: that evidence with
    this round's runs added (None: none was kept).
    """

    reason: str
    evaluation: LoggedEvaluation
    evidence: dict[str, Any]
    winner: str | None = None
    decided_by: str | None = None
    sequence: Evidence | None = None

    @property
    def promoted(self) -> bool:
        """A challenger is promoted."""
        return self.winner is not None


def judge(
    candidate: Policy,
    champion: Policy,
    held: Path,
    *,
    lam: float,
    objective: Objective,
    heuristics: Mapping[str, Policy] | None = None,
    heuristics_compete: bool = False,
    cost_unit: str | None = None,
    labels_from_rewards: bool = False,
    group_by: str = "task",
    n_boot: int = 1000,
    seed: int = 0,
    sequence: Evidence | None = None,
) -> Judgement:
    """Judge ``candidate`` (and, with ``heuristics_compete``, every heuristic) against ``champion``.

    Every policy is replayed off-policy on the logged runs in ``held`` through its own
    ``decide`` with ``objective`` (as the service is asked); values are ``q − lam·c``. A
    challenger is eligible when its figure and the champion's
    are supported and the lower end of the paired 90% interval of (challenger − champion),
    doubly robust, is above 0 -- or it is never worse on any run and better on some. The
    candidate wins when eligible, unless a heuristic is eligible and better than it (the lower
    end of their paired difference above 0); else the eligible one with the highest mean.

    ``sequence``: the candidate's evidence from earlier rounds against this champion. When
    both figures are supported but for their number of runs (fewer than ``MIN_RUNS`` do), the
    runs of ``held`` it has not counted add their paired DR differences to it (in place); once
    its e-value
    reaches ``1/alpha`` the candidate is promoted on it (``decided_by="sequence"``), before a
    heuristic that this round does not show better than the candidate.
    """
    heuristics = dict(heuristics or {})
    policies: dict[str, Policy] = {"candidate": candidate, "champion": champion, **heuristics}
    ev = evaluate_logged_runs(
        policies,
        [held],
        lam=lam,
        objective=objective,
        cost_unit=cost_unit,
        labels_from_rewards=labels_from_rewards,
        group_by=group_by,
        n_boot=n_boot,
        seed=seed,
    )
    dp = ev.dp
    n = dp.n_traces
    first, last = _ends(held)
    champ = ev.estimates["champion"]
    names = ["candidate", *(heuristics if heuristics_compete else ())]
    diffs = {name: ev.difference(name, "champion", GATE_ESTIMATOR) for name in names}
    better = {
        name: diffs[name][1][0] > 0.0 or ev.dominates(name, "champion", GATE_ESTIMATOR) for name in names
    }
    eligible = [name for name in names if champ.enough and ev.estimates[name].enough and better[name]]
    # the candidate is the trainer's choice (its guard already weighed it against the heuristics on
    # the training runs): a heuristic replaces it only when the held-out runs say it is better
    if "candidate" in eligible:
        rivals = [
            n
            for n in eligible
            if n != "candidate" and ev.difference(n, "candidate", GATE_ESTIMATOR)[1][0] > 0
        ]
        eligible = rivals or ["candidate"]
    winner = max(eligible, key=lambda name: diffs[name][0]) if eligible else None
    decided_by = None if winner is None else "interval"
    cand = ev.estimates["candidate"]
    seq: dict[str, Any] | None = None
    if sequence is not None:
        # a confidence sequence holds at any number of runs: a round too small for a figure adds
        # its runs, a round whose figure rests on the model or on a few uneven weights does not
        supported = all(supported_at_any_count(e) for e in (champ, cand))
        added = 0
        if supported:
            x = ev.runs["candidate"].dr - ev.runs["champion"].dr
            # a run's value q − lam·c is in [−lam·c, 1]: a paired difference read exactly is above
            # −(1 + lam·c_final), one through an importance weight w above about −w·(1 + lam·c_final):
            # the floor the martingale's bets are sized on (sequential.py)
            weight = max(1.0, cand.max_weight)
            floor = weight * (1.0 + lam * float(dp.trace_c_final.max(initial=0.0)))
            added = sequence.add(dp.trace_id.tolist(), x, floor=floor)
        seq = {**sequence.summary(), "added": added, "supported": supported}
        heuristic_better = (
            winner is not None
            and winner != "candidate"
            and ev.difference(winner, "candidate", GATE_ESTIMATOR)[1][0] > 0
        )
        if winner != "candidate" and seq["passed"] and not heuristic_better:
            winner, decided_by = "candidate", "sequence"

    def said(name: str) -> str:
        diff, (lo, hi) = diffs[name]
        return f"{name} − champion = {diff:+.4f} per run, 90% interval [{lo:+.4f}, {hi:+.4f}]"

    if decided_by == "sequence":
        assert seq is not None
        reason = (
            f"better by the sequential evidence: {describe(seq)}; this round alone, on the {n} "
            f"held-out runs: {said('candidate')}"
        )
        if not (cand.enough and champ.enough):
            reason += f" (not a figure: {cand.why or champ.why})"
    elif winner is not None:
        reason = f"better on the {n} held-out runs: {said(winner)}"
        if diffs[winner][1][0] <= 0.0:
            reason += " (never worse on any of them)"
        if winner != "candidate":
            why = "its figure is not supported" if not cand.enough else said("candidate")
            reason += f" (the fitted candidate: {why}; {winner} is promoted)"
    elif not cand.enough:
        reason = f"the candidate's figure is not supported: {cand.why}"
    elif not champ.enough:
        reason = f"the champion's figure is not supported: {champ.why}"
    else:
        reason = f"not better on the {n} held-out runs: {said('candidate')}: its lower end is not above 0"
    if winner is None and len(names) > 1:
        best = max(names[1:], key=lambda name: diffs[name][1][0])
        reason += (
            f"; no tuned heuristic is better either (the best, {best}: lower end {diffs[best][1][0]:+.4f})"
        )
    if winner is None and seq is not None:
        reason += f"; the sequential evidence: {describe(seq)}"
    shown = winner or "candidate"
    diff, (lo, hi) = diffs[shown]
    evidence = {
        "lambda": lam,
        "cost_unit": dp.cost_unit,
        # the oldest and the most recent run judged on (the decision points hold them by id)
        "judged_on": {
            "first": first,
            "last": last,
            "groups": len(set(dp.group.tolist())),
        },
        "estimates": ev.to_dict()["policies"],
        "winner": winner,
        "decided_by": decided_by,
        "sequential": seq,
        "difference": {"policy": shown, "estimator": GATE_ESTIMATOR, "mean": diff, "ci90": [lo, hi]},
        "challengers": {
            name: {"mean": d, "ci90": list(ci), "enough": ev.estimates[name].enough}
            for name, (d, ci) in diffs.items()
        },
    }
    return Judgement(reason, ev, evidence, winner, decided_by, sequence)


def open_store(
    log_dir: str | Path | None = None, model_store: str | Path | None = None
) -> tuple[ModelStore, Path]:
    """The model store and the log directory: those given, else the settings' (``STOPSERVE_``)."""
    settings = load_settings()
    logs = Path(log_dir) if log_dir else settings.log_dir
    if logs is None:
        raise ConfigError("no log directory: give log_dir (--log-dir; STOPSERVE_LOG_DIR is empty)")
    root = model_store or settings.model_store or logs / "models"
    return ModelStore(root), logs


def logged_table(ev: LoggedEvaluation) -> str:
    """The off-policy figures of every policy, one row each, with their support."""
    rows = [
        (
            "policy",
            "IS",
            "IS 90% interval",
            "DR",
            "DR 90% interval",
            "runs exact/weighted/zeroed/unsupported",
            "ESS",
            "support",
        )
    ]
    for name, e in ev.estimates.items():
        rows.append(
            (
                name,
                f"{e.ips:.4f}",
                f"[{e.ips_ci90[0]:.4f}, {e.ips_ci90[1]:.4f}]",
                f"{e.dr:.4f}",
                f"[{e.dr_ci90[0]:.4f}, {e.dr_ci90[1]:.4f}]",
                f"{e.exact}/{e.weighted}/{e.zeroed}/{e.unsupported}",
                f"{e.ess:.0f}",
                "ok" if e.enough else "too few",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
