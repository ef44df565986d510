"""The generator: format-v1 traces of simulated runs, their behavior stops, the optimum and failure modes.

A run's course (its :class:`_Skeleton`: quality levels, stuck rounds, proposals) is
drawn first from its own random stream, then its events (tokens, times, refs,
errors) from another, so every stop rule is judged on the same run.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from stopserve.errors import ConfigError
from stopserve.training.simulate.optimal import OptimalRule, solve
from stopserve.training.simulate.topology import (
    MODELS,
    ORCHESTRATOR,
    SIM_TOPOLOGIES,
    Spec,
    TopologyModel,
    model_for,
)

__all__ = ["BEHAVIORS", "DEFAULT_NOISE", "FAILURE_MODES", "failure_modes", "simulate"]

#: Behavior (logging) policies; ``metrics.behavior_policy`` holds the index.
BEHAVIORS: Final[tuple[str, ...]] = ("turn_cap", "verifier_threshold", "orchestrator")
#: Default standard deviation of the grade around the verifier's score.
DEFAULT_NOISE: Final = 0.05
SYSTEM: Final = "stopserve-sim"
_VERIFIER: Final = "verifier"


@dataclass
class _Skeleton:
    """A run's course round by round, drawn from its own random stream: everything that
    decides where any rule stops and how many decision points there are, and nothing else."""

    states: list[tuple[int, int, int, int]]  # (mu, m, n, z) after each round
    present: list[tuple[bool, ...] | None]  # per working round, which groups ran (None: stuck)
    proposals: list[bool]
    dp_per_round: list[int]

    def dp_total(self) -> int:
        return sum(self.dp_per_round)

    def steps(self, count: int) -> int:
        """Agent steps among the first ``count`` decision points (``RunState.turn`` there).

        Every round has one reward event, a decision point but not a step: it comes after
        the round's aggregate, before its proposal.
        """
        seen = rewards = 0
        for per, proposed in zip(self.dp_per_round, self.proposals, strict=True):
            if seen + per - proposed <= count:
                rewards += 1
            seen += per
            if seen >= count:
                break
        return count - rewards

    def round_of_dp(self, count: int) -> int:
        """The round (1-based) holding the ``count``-th decision point."""
        seen = 0
        for k, per in enumerate(self.dp_per_round, start=1):
            seen += per
            if seen >= count:
                return k
        return len(self.dp_per_round)


def _skeleton(model: TopologyModel, rng: random.Random, ceiling: int) -> _Skeleton:
    comp = _compiled(model)
    rand = rng.random
    states: list[tuple[int, int, int, int]] = []
    present: list[tuple[bool, ...] | None] = []
    proposals: list[bool] = []
    dp_per_round: list[int] = []
    ups, p_prop, p_down = comp.ups, comp.p_propose, model.p_down
    p_stuck, p_stay = model.p_stuck, model.p_stay_stuck
    groups = tuple(zip((p for p, _ in comp.round), comp.round_dps, strict=True))
    mu = _pick(rng, model.init)
    best, n_best = mu, 0
    stuck = False
    for k in range(model.rounds):
        if k:
            stuck = rand() < (p_stay if stuck else p_stuck)
            if not stuck:
                u = rand()
                pd = p_down if mu > 0 else 0.0
                if u < pd:
                    mu -= 1
                elif mu < ceiling and u < pd + ups[mu]:
                    mu += 1
                    if mu > best:
                        best, n_best = mu, 0
                elif mu == best:
                    n_best += 1
        if stuck:
            present.append(None)
            dps = comp.stuck_dps
        else:
            mask: list[bool] = []
            dps = 0
            for p, n in groups:
                ran = p >= 1.0 or rand() < p
                mask.append(ran)
                if ran:
                    dps += n
            present.append(tuple(mask))
        proposed = rand() < p_prop[mu]
        states.append((mu, best, n_best, int(stuck)))
        proposals.append(proposed)
        dp_per_round.append(dps + 2 + proposed)  # + aggregate, reward (+ proposal)
    return _Skeleton(states, present, proposals, dp_per_round)


@dataclass
class _Run:
    events: list[dict[str, Any]]
    dp: list[int]  # indices of decision-point events
    dp_grade: list[float]  # grade in force at each decision point
    round_end: list[int]  # last event of each round (index k-1 for round k)
    round_reward: list[int]  # the reward event of each round
    round_grade: list[float]
    round_tokens: list[int]  # tokens up to and including each round's last event
    first_return: int
    first_return_tokens: int


_IDS: Final[list[str]] = [f"e{i}" for i in range(4096)]
_DP_TYPES: Final = frozenset({"return", "aggregate", "reward"})


def _event_id(i: int) -> str:
    return _IDS[i] if i < len(_IDS) else f"e{i}"


@dataclass(frozen=True, slots=True)
class _Slot:
    """A :class:`Spec` precompiled for the hot loop."""

    template: dict[str, Any]
    lo: int
    span: int
    p_error: float
    nano_usd: int  # price per token in 1e-9 USD (integer, so usd prints short)
    tool: bool
    ref: bool
    ret: bool
    dp: bool


def _slot(spec: Spec, model: TopologyModel) -> _Slot:
    template: dict[str, Any] = {"type": spec.type, "agent": spec.agent}
    if spec.to is not None:
        template["to"] = spec.to
    if spec.tool is not None:
        template["tool"] = spec.tool
    price = model.usd_per_token[0] if spec.agent == ORCHESTRATOR else model.usd_per_token[1]
    return _Slot(
        template,
        spec.lo,
        spec.hi - spec.lo + 1,
        spec.p_error,
        round(price * 1e9),
        spec.tool is not None,
        spec.type not in ("delegate", "spawn"),
        spec.type == "return",
        spec.type in _DP_TYPES,
    )


@dataclass(frozen=True)
class _Compiled:
    spawns: tuple[_Slot, ...]
    round: tuple[tuple[float, tuple[_Slot, ...]], ...]
    round_dps: tuple[int, ...]  # decision points per group
    stuck: tuple[_Slot, ...]
    stuck_dps: int
    aggregate: _Slot
    ups: tuple[float, ...]  # p_up per level
    p_propose: tuple[float, ...]  # chance of a stop proposal per verifier level


_COMPILED: dict[int, _Compiled] = {}


def _compiled(model: TopologyModel) -> _Compiled:
    c = _COMPILED.get(id(model))
    if c is None:
        lo, hi = model.spawn_tokens
        groups = tuple((g.p, tuple(_slot(s, model) for s in g.events)) for g in model.round)
        stuck = tuple(_slot(s, model) for s in model.stuck_round)
        c = _Compiled(
            tuple(_slot(Spec("spawn", ORCHESTRATOR, to=w, lo=lo, hi=hi), model) for w in model.workers),
            groups,
            tuple(sum(s.dp for s in slots) for _, slots in groups),
            stuck,
            sum(s.dp for s in stuck),
            _slot(model.aggregate, model),
            tuple(model.up(mu) for mu in range(model.levels + 1)),
            tuple(
                model.p_propose + model.p_propose_good * max(0.0, mu / model.levels - 0.5) * 2.0
                for mu in range(model.levels + 1)
            ),
        )
        if model is MODELS.get(model.name):  # cache the shipped models only (ids of others recycle)
            _COMPILED[id(model)] = c
    return c


def _grade(rng: random.Random, mean: float, noise: float) -> float:
    # symmetric truncation keeps the deviation zero-mean and the grade in [0, 1]
    half = min(mean, 1.0 - mean)
    dev = rng.gauss(0.0, noise) if noise > 0 else 0.0
    dev = max(-half, min(half, dev))
    return round(mean + dev, 4)


def _contribute(events: list[dict[str, Any]], start: int, d_level: float, d_grade: float) -> None:
    """The offline label ``contribution`` of a round's ``return``s and ``aggregate`` (events from ``start``).

    The round's level change ``d_level`` is split over its returns and its aggregate in
    proportion to their tokens; the aggregate (the last of them) also carries the change of
    the answer's own deviation, ``d_grade - d_level``. So a round's contributions sum to its
    change of grade (docs/simulator.md, "Contribution"). No random draw: the runs are unchanged.
    ``start = -1``: the returns after the last aggregate (a run stopped mid-round) get 0.
    """
    if start < 0:
        start = next((i + 1 for i in range(len(events) - 1, -1, -1) if events[i]["type"] == "aggregate"), 0)
    carriers = [ev for ev in events[start:] if ev["type"] in ("return", "aggregate")]
    if not carriers:
        return
    total = sum(ev["tokens"] for ev in carriers)
    for ev in carriers:
        ev["contribution"] = round(d_level * ev["tokens"] / total, 6) if total else 0.0
    if carriers[-1]["type"] == "aggregate":
        carriers[-1]["contribution"] = round(carriers[-1]["contribution"] + d_grade - d_level, 6)


def _pick(rng: random.Random, probs: Sequence[float]) -> int:
    u = rng.random()
    acc = 0.0
    for i, p in enumerate(probs):
        acc += p
        if u < acc:
            return i
    return len(probs) - 1


def _materialize(
    model: TopologyModel, skel: _Skeleton, rng: random.Random, noise: float, rounds: int
) -> _Run:
    """The events of the first ``rounds`` rounds of ``skel``; details (tokens, times, refs,
    errors, grade deviations) from ``rng``.

    Written for speed (this loop is the simulator's cost): plain dicts, integer
    milliseconds and nano-dollars, no pydantic; the tests validate the output.
    """
    comp = _compiled(model)
    rand = rng.random
    bits = rng.getrandbits
    events: list[dict[str, Any]] = []
    append = events.append
    dp: list[int] = []
    dp_grade: list[float] = []
    t_ms = 0
    tokens_total = 0
    q = 0.0
    first_return = -1
    first_return_tokens = 0
    ids, n_ids = _IDS, len(_IDS)

    def emit(slot: _Slot, ref: str | None, error: bool) -> None:
        nonlocal t_ms, tokens_total, first_return, first_return_tokens
        tok = slot.lo + int(rand() * slot.span)
        t_ms += 50 + 20 * tok + int(rand() * (2000 if slot.tool else 200))
        i = len(events)
        ev = {"id": ids[i] if i < n_ids else f"e{i}", "t": t_ms / 1000, **slot.template}
        if ref is not None:
            ev["content_ref"] = ref
        ev["tokens"] = tok
        ev["usd"] = tok * slot.nano_usd / 1e9
        if error:
            ev["error"] = True
        tokens_total += tok
        append(ev)
        if slot.dp:
            dp.append(i)
            dp_grade.append(q)
            if slot.ret and first_return < 0:
                first_return, first_return_tokens = i, tokens_total

    def info(kind: str, agent: str, extra: dict[str, Any]) -> int:
        nonlocal t_ms
        t_ms += 50 + int(rand() * 200)
        i = len(events)
        append({"id": _event_id(i), "t": t_ms / 1000, "type": kind, "agent": agent, **extra})
        dp.append(i)
        dp_grade.append(q)
        return i

    for slot in comp.spawns:
        emit(slot, None, False)
    levels = model.levels
    round_end: list[int] = []
    round_reward: list[int] = []
    round_grade: list[float] = []
    round_tokens: list[int] = []
    agg_ref = ""
    loop_refs: list[str] = []
    loop_errors: list[bool] = []
    level = 0.0  # the answer's level before the round (no answer yet: 0)
    for k in range(rounds):
        mu = skel.states[k][0]
        mask = skel.present[k]
        start, q_before = len(events), q
        if mask is None:
            if not loop_refs:
                loop_refs = [f"{bits(48):012x}" for _ in comp.stuck]
                loop_errors = [s.tool and rand() < 0.7 for s in comp.stuck]
            for slot, ref, err in zip(comp.stuck, loop_refs, loop_errors, strict=True):
                emit(slot, ref, err)
        else:
            loop_refs = []
            for ran, (_, slots) in zip(mask, comp.round, strict=True):
                if not ran:
                    continue
                for slot in slots:
                    if slot.ref:
                        err = slot.p_error > 0.0 and rand() < slot.p_error
                        emit(slot, f"{bits(48):012x}", err)
                    else:
                        emit(slot, None, False)
            agg_ref = f"{bits(48):012x}"
            # a new answer: its grade is set before the aggregate counts as a decision point
            q = _grade(rng, mu / levels, noise)
        emit(comp.aggregate, agg_ref, False)
        events[-1]["grade"] = q
        _contribute(events, start, mu / levels - level, q - q_before)
        level = mu / levels
        value = mu / levels
        round_reward.append(
            info("reward", _VERIFIER, {"tokens": 0, "usd": 0.0, "value": value, "channel": "quality"})
        )
        if skel.proposals[k]:
            info(
                "stop",
                ORCHESTRATOR,
                {"tokens": 0, "usd": 0.0, "reason": "information_complete", "proposed": True},
            )
        round_end.append(len(events) - 1)
        round_grade.append(q)
        round_tokens.append(tokens_total)
    return _Run(
        events,
        dp,
        dp_grade,
        round_end,
        round_reward,
        round_grade,
        round_tokens,
        first_return,
        first_return_tokens,
    )


def _behavior_stop(
    model: TopologyModel, skel: _Skeleton, behavior: int, param: float
) -> tuple[int, str, str, str]:
    """Where the behavior stops: (round, 1-based; the event in it: "dp", "reward",
    "proposal" or "cap"; stop reason; who stopped)."""
    if behavior == 0 and param <= skel.dp_total():
        return skel.round_of_dp(int(param)), "dp", "budget_exhausted", "safety_net"
    if behavior == 1:
        for k, (mu, *_) in enumerate(skel.states, start=1):
            if mu / model.levels >= param:
                return k, "reward", "quality_met", "orchestrator"
    if behavior == 2 and any(skel.proposals):
        return skel.proposals.index(True) + 1, "proposal", "information_complete", "orchestrator"
    return model.rounds, "cap", "budget_exhausted", "safety_net"


def _stop_index(run: _Run, k: int, where: str, param: float) -> int:
    if where == "dp":
        return run.dp[int(param) - 1]
    if where == "reward":
        return run.round_reward[k - 1]
    return run.round_end[k - 1]


def _optimal_round(skel: _Skeleton, rule: OptimalRule) -> int:
    """The round after which the optimal rule stops; 0 for round 1's first return."""
    if rule.stop_first:
        return 0
    for k, state in enumerate(skel.states, start=1):
        if rule.stop[(k, *state)]:
            return k
    raise AssertionError("the optimal rule always stops by the hard cap")  # pragma: no cover


def _optimal_stop(run: _Run, k: int) -> tuple[int, float, int]:
    """Where the optimal rule stops (round ``k``): event index, grade there, tokens so far."""
    if k == 0:
        return run.first_return, 0.0, run.first_return_tokens
    return run.round_end[k - 1], run.round_grade[k - 1], run.round_tokens[k - 1]


def _task_plan(n: int, seed: int, topology: str) -> Iterator[tuple[int, str, int]]:
    """(task index, topology, difficulty) for each of ``n`` runs; 2-4 runs per task."""
    rng = random.Random(f"stopserve-sim:{seed}:tasks")
    made = task = 0
    topologies = SIM_TOPOLOGIES if topology == "all" else (topology,)
    while made < n:
        topo = topologies[task % len(topologies)]
        model = MODELS[topo]
        difficulty = _pick(rng, model.difficulty)
        for _ in range(min(2 + int(rng.random() * 3), n - made)):
            yield task, topo, difficulty
            made += 1
        task += 1


def simulate(
    n: int,
    *,
    seed: int = 0,
    topology: str = "all",
    optimal_lambda: float | None = None,
    run_to_cap: bool = False,
    noise: float = DEFAULT_NOISE,
) -> Iterator[dict[str, Any]]:
    """Yield ``n`` format-v1 traces as JSON-ready dicts (deterministic for ``seed``).

    With ``optimal_lambda`` each trace's ``metrics`` carries ``optimal_value``,
    ``optimal_lambda`` and ``optimal_stop_index``. With ``run_to_cap`` every run
    goes on to the hard cap and every decision point carries ``grade``.
    """
    if topology != "all":
        model_for(topology)
    if not (noise >= 0 and math.isfinite(noise)):
        raise ConfigError(f"noise: expected a finite number >= 0, got {noise}")
    rules: dict[str, OptimalRule] = {}
    if optimal_lambda is not None:
        for topo in SIM_TOPOLOGIES if topology == "all" else (topology,):
            rules[topo] = solve(MODELS[topo], optimal_lambda)
    for i, (task, topo, difficulty) in enumerate(_task_plan(n, seed, topology)):
        model = MODELS[topo]
        rng = random.Random(f"stopserve-sim:{seed}:{i}")
        behavior = _pick(rng, (0.34, 0.33, 0.33))
        if behavior == 0:
            per_round = 2 + sum(g.p for g in model.round for s in g.events if s.type == "return")
            param = float(int(per_round * (1 + rng.random() * (model.rounds - 1) * 0.6)))
        elif behavior == 1:
            param = round(0.5 + 0.4 * rng.random(), 2)
        else:
            param = 0.0
        skel = _skeleton(model, rng, model.ceiling(difficulty))
        stop = _behavior_stop(model, skel, behavior, param)
        rule = rules.get(topo)
        opt_round = -1 if rule is None else _optimal_round(skel, rule)
        rounds = model.rounds if run_to_cap else max(stop[0], opt_round, 1)
        detail = random.Random(f"stopserve-sim:{seed}:{i}:detail")
        run = _materialize(model, skel, detail, noise, rounds)
        yield _finish(
            run,
            skel,
            stop,
            opt_round,
            i=i,
            seed=seed,
            task=task,
            topo=topo,
            model=model,
            difficulty=difficulty,
            behavior=behavior,
            param=param,
            rule=rule,
            run_to_cap=run_to_cap,
        )


def _finish(
    run: _Run,
    skel: _Skeleton,
    stop_at: tuple[int, str, str, str],
    opt_round: int,
    *,
    i: int,
    seed: int,
    task: int,
    topo: str,
    model: TopologyModel,
    difficulty: int,
    behavior: int,
    param: float,
    rule: OptimalRule | None,
    run_to_cap: bool,
) -> dict[str, Any]:
    metrics: dict[str, float] = {
        "behavior_policy": float(behavior),
        "behavior_param": param,
        "task_difficulty": float(difficulty),
        "quality_ceiling": model.ceiling(difficulty) / model.levels,
    }
    k_stop, where, reason, by = stop_at
    b_stop = _stop_index(run, k_stop, where, param)
    # the cap in force, in agent steps (a reward event is a decision point but not a step)
    max_turns = skel.steps(int(param) if where == "dp" else skel.dp_total())
    if run_to_cap:
        end, reason, by = run.round_end[-1], "budget_exhausted", "safety_net"
        metrics["behavior_stop_index"] = float(b_stop)
        metrics["run_to_cap"] = 1.0
        events = run.events
        for j, grade in zip(run.dp, run.dp_grade, strict=True):
            events[j]["grade"] = grade
        max_turns = skel.steps(skel.dp_total())
    else:
        end = b_stop
        events = run.events[: end + 1]
        _contribute(events, -1, 0.0, 0.0)  # a round cut before its aggregate wrote no answer
    if rule is not None:
        opt, q_opt, c_opt = _optimal_stop(run, opt_round)
        metrics["optimal_value"] = q_opt - rule.lam * (c_opt / 1000.0)
        metrics["optimal_lambda"] = rule.lam
        metrics["optimal_stop_index"] = float(opt)
        metrics["optimal_grade"] = q_opt
        metrics["optimal_ktokens"] = c_opt / 1000.0
        if opt > end:
            metrics["optimal_after_end"] = 1.0
    t_end = events[-1]["t"]
    stop_event: dict[str, Any] = {
        "id": f"e{len(events)}",
        "t": t_end,
        "type": "stop",
        "agent": ORCHESTRATOR,
        "reason": reason,
        "proposed": False,
        "tokens": 0,
        "usd": 0.0,
    }
    stop: dict[str, Any] = {"reason": reason, "by": by, "t": t_end}
    if reason == "budget_exhausted":
        stop["limit"] = "turns"
    final_q = run.dp_grade[bisect.bisect_left(run.dp, end)]  # every stop is at a decision point
    return {
        "format": "stopserve.trace/1",
        "trace_id": f"sim-{seed}-{i}",
        "task_id": f"simtask-{seed}-{task}",
        "system": f"{SYSTEM}/{BEHAVIORS[behavior]}",
        "topology": topo,
        "events": [*events, stop_event],
        "rewards": {"team": final_q},
        "stop": stop,
        "budget": {"max_turns": max_turns},
        "metrics": metrics,
    }


# --------------------------------------------------------------------------- failure modes

#: The failure modes of a stop decision, as :func:`failure_modes` names them.
FAILURE_MODES: Final[tuple[str, ...]] = ("premature", "delayed", "loop")


def failure_modes(trace: Mapping[str, Any], stop_index: int) -> dict[str, bool]:
    """Which failure modes a stop right after event ``stop_index`` shows, against the optimum.

    Needs a trace made with ``--optimal``; values are ``q - lam * ktokens`` at that
    ``lam``. ``premature``: stopped before the optimal point, for less value (e.g. a
    stop proposal accepted too early). ``delayed``: stopped after it, for less value
    (quality flat, cost rising). ``loop``: went on through 2 or more stuck rounds
    (an aggregate repeating the previous one's content ref) past the optimal point.
    A behavior's own stop is the event before the final ``stop`` event:
    ``len(trace["events"]) - 2``.

    >>> t = next(simulate(1, seed=0, optimal_lambda=0.1))
    >>> sorted(failure_modes(t, len(t["events"]) - 2))
    ['delayed', 'loop', 'premature']
    """
    metrics = trace.get("metrics") or {}
    if "optimal_stop_index" not in metrics:
        raise ConfigError(
            f"trace {trace.get('trace_id')!r}: no metrics.optimal_stop_index (simulate --optimal)"
        )
    events = trace["events"]
    opt = int(metrics["optimal_stop_index"])
    q_stop = 0.0
    tokens = 0
    stuck_after_opt = 0
    previous_ref: object = None
    for i, event in enumerate(events[: stop_index + 1]):
        tokens += int(event.get("tokens") or 0)
        if event.get("type") != "aggregate":
            continue
        if i > opt and event.get("content_ref") == previous_ref:
            stuck_after_opt += 1
        previous_ref = event.get("content_ref")
        q_stop = float(event.get("grade", q_stop))
    worse = q_stop - float(metrics["optimal_lambda"]) * tokens / 1000.0 < float(metrics["optimal_value"])
    return {
        "premature": stop_index < opt and worse,
        "delayed": stop_index > opt and worse,
        "loop": stuck_after_opt >= 2,
    }
