"""One decision on a run's state: the champion's, with exploration, and the challengers' in the shadow.

:meth:`Decider.decide` is what every decide call (a run's, a stateless prefix, each run
of a batch) asks: the challengers answer first (never acted on), the probability of
exploring the champion's stop follows from them (``STOPSERVE_EXPLORE``), then the
champion decides. :meth:`Decider.count` counts a call's decisions once it is committed
(a call started over after a store conflict is counted once).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from stopserve.decision import StopDecision
from stopserve.features import RunState
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.safety import SafetyConfig
from stopserve.service.metrics import Metrics
from stopserve.service.shadow import Challenger, Challengers, ShadowCall
from stopserve.service.store import Run
from stopserve.settings import Settings

__all__ = ["Decided", "Decider", "objective_of"]


@dataclass(frozen=True, slots=True)
class Decided:
    """A call's decision and its challengers' (counted once the call is committed)."""

    decision: StopDecision
    shadow: list[ShadowCall]


class Decider:
    """The policy call, exploration and the shadow challengers of one service process."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        challengers: Challengers,
        default_safety: SafetyConfig | None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.challengers = challengers
        self.default_safety = default_safety
        self._rng = random.Random(settings.seed)
        self._exploration = settings.exploration  # computed once: the settings do not change
        # a large request decides in a worker thread while the event loop decides the others:
        # the policy's single-row predictor shares one output buffer, so decisions take turns
        self._policy_lock = threading.Lock()

    def decide(  # noqa: PLR0917
        self,
        policy: Policy,
        state: RunState,
        objective: Objective | None,
        safety: SafetyConfig | None,
        proposed_stop: bool,
        run: Run | None = None,
    ) -> Decided:
        """The champion's decision on ``state`` (explored where ε says) and the challengers'.

        ``objective`` is what cost is worth for this call (:func:`objective_of`; None: the
        model's own). ``run`` is the live run deciding (None: a stateless prefix): it remembers that it
        was explored and where each challenger would have stopped it.
        """
        theirs = self._challenged(state, objective, safety, proposed_stop)
        epsilon = self.epsilon(run.explored if run is not None else False, theirs)
        decision = self._decide(policy, state, objective, safety, proposed_stop, epsilon)
        if run is not None:
            run.explored = run.explored or decision.explored
        return Decided(decision, self._shadow(run, decision, theirs, state))

    def _decide(  # noqa: PLR0917
        self,
        policy: Policy,
        state: RunState,
        objective: Objective | None,
        safety: SafetyConfig | None,
        proposed_stop: bool,
        epsilon: float = 0.0,
    ) -> StopDecision:
        with self._policy_lock:
            return policy.decide(
                state,
                objective=objective,
                safety=safety if safety is not None else self.default_safety,
                proposed_stop=proposed_stop,
                epsilon=epsilon,
                rng=self._rng,
            )

    # ------------------------------------------------------------------ exploration

    def epsilon(self, explored: bool, theirs: Sequence[tuple[Challenger, StopDecision]]) -> float:
        """The probability that the run's stop now is explored (``STOPSERVE_EXPLORE``).

        ε; where a challenger would go on, ``explore_disagree`` (what a retrain needs to judge
        it: runs that show what follows the champion's stop). Once the run was explored,
        1 − 1/explore_steps; where a challenger would go on, ``explore_follow`` (the run follows
        it to its own stop). It depends on the run's state alone, so the logged propensity is
        the true probability of the action taken.
        """
        plain, aimed = self._exploration[1 if explored else 0]
        return aimed if theirs and any(d.action == "continue" for _, d in theirs) else plain

    # ------------------------------------------------------------------ shadows

    def _challenged(
        self,
        state: RunState,
        objective: Objective | None,
        safety: SafetyConfig | None,
        proposed_stop: bool,
    ) -> list[tuple[Challenger, StopDecision]]:
        """Every challenger's answer on the run's state (no exploration), never acted on."""
        if not self.challengers:
            return []
        return [
            (c, self._decide(c.policy, state, objective, safety, proposed_stop)) for c in self.challengers
        ]

    @staticmethod
    def _shadow(
        run: Run | None,
        champion: StopDecision,
        theirs: Sequence[tuple[Challenger, StopDecision]],
        state: RunState,
    ) -> list[ShadowCall]:
        """The challengers' answers to count and log; the run remembers their stops."""
        calls: list[ShadowCall] = []
        compare = run is not None and champion.action == "stop" and not run.shadow_done
        for challenger, mine in theirs:
            first: int | None = None
            if run is not None:
                if mine.action == "stop":
                    run.shadow.setdefault(challenger.name, state.turn)
                first = run.shadow.get(challenger.name)
            calls.append(ShadowCall(challenger, mine, compare, first))
        if compare and run is not None:
            run.shadow_done = True
        return calls

    # ------------------------------------------------------------------ counting

    def count(self, decided: Decided, start: float) -> None:
        """Count a committed call: its latency since ``start``, its decision, its shadow decisions."""
        m = self.metrics
        champion = decided.decision
        m.latency.observe(time.perf_counter() - start)
        m.count_decision(champion.action, champion.reason, champion.safety_net)
        if champion.explored:
            m.explored.inc()
        for call in decided.shadow:
            c = call.challenger
            c.count(call.decision, champion)
            m.challenger_decisions.labels(
                challenger=c.name, agree="true" if call.decision.action == champion.action else "false"
            ).inc()
            if call.compared:
                ahead = c.compare_stop(call.first_stop, call.decision, champion.turn)
                m.challenger_runs.labels(
                    challenger=c.name, stop="later" if ahead is None else "earlier" if ahead else "same"
                ).inc()
                if ahead is not None:
                    m.challenger_turns_earlier.labels(challenger=c.name).observe(ahead)


@functools.lru_cache(maxsize=256)
def _objective(lam: float | None, cost_share: float | None) -> Objective | None:
    # a service sees a handful of distinct values, asked on every call
    return Objective.of(lam, cost_share)


def objective_of(
    lam: float | None, cost_share: float | None, default: Objective | None = None
) -> Objective | None:
    """What cost is worth for a call: the ``lambda`` / ``cost_share`` given (a request's, or the
    last one a run's requests gave; both: :class:`~stopserve.errors.ConfigError`), else
    ``default`` (the settings' ``STOPSERVE_LAMBDA`` / ``STOPSERVE_COST_SHARE``); None: the
    served model's own objective."""
    own = _objective(lam, cost_share)
    return own if own is not None else default
