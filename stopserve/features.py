"""The one featurizer: :class:`RunState` folds a run one event at a time.

The trainer folds logged traces with it and the service folds live events with it,
so train and serve cannot drift. ``FEATURE_NAMES`` is the one list of feature
names, in the order of :meth:`RunState.features`; ``docs/features.md`` gives each
one's meaning and unit.

>>> from stopserve.trace import Event
>>> s = RunState(topology="harness")
>>> s.fold(Event(id="a", t=0.0, type="tool_use", agent="x", tokens=10))
True
>>> s.fold(Event(id="b", t=1.5, type="return", agent="x", error=True))
True
>>> s.turn, s.tokens, s.elapsed
(1, 10, 1.5)
>>> float(s.features()[FEATURE_NAMES.index("errors_consecutive")])
1.0

Cost: ``fold`` is O(1) amortized and allocates nothing that grows with the run
except the bounded structures below; ``features`` is O(number of features).
Memory per run is bounded by the window sizes (constructor arguments):

* ``seen_window`` event ids (default 4,096) for idempotent retries: an event
  whose id is among the newest ``seen_window`` folded ids is skipped (ids older
  than twice that are forgotten). A retry must therefore resend a *recent* event,
  as request retries do (the service takes at most 2,000 events a request);
  about 100 bytes per id.
* ``ref_window`` content refs (default 1,024) with their counts, the most recently
  seen kept (ids and refs are compacted in one O(window) pass every ``window``
  insertions, O(1) amortized). Refs longer than 256 characters are replaced by a
  16-byte blake2b digest, so a huge ref costs no more memory than a short one.
* at most ``max_agents`` (default 1,024) agent names and 64 reward channels;
  further ones are folded but not remembered by name.

Conventions: a value that is not known yet (no budget given, no reward seen, no
stop proposed yet) is ``NaN``, which LightGBM treats as missing. Per-event
``grade`` is an offline label and is never read here.
"""

from __future__ import annotations

import functools
import hashlib
import math
import operator
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stopserve.errors import Issue, TraceValidationError
from stopserve.signals import sketch as _sketch
from stopserve.trace import EVENT_TYPES, TOPOLOGIES, Budget, Event, Progress

__all__ = [
    "ABSOLUTE_SCALE_FEATURES",
    "BUDGET_SHARE_FEATURES",
    "CYCLE_MAX_PERIOD",
    "FEATURE_GROUPS",
    "FEATURE_NAMES",
    "LOOP_PATTERNS",
    "RunState",
    "scale_free_features",
]

_NAN: Final = math.nan
_INF: Final = math.inf

#: Number of most recent outcomes the error share is taken over.
ERROR_WINDOW: Final = 10
#: Number of latest rewards (primary channel) the recent reward gain is taken over.
REWARD_TREND_WINDOW: Final = 4
#: Number of most recent events the distinct-ref ratio is taken over.
REF_RATIO_WINDOW: Final = 20
#: Content refs longer than this are hashed before they are remembered.
MAX_REF_CHARS: Final = 256
#: Event ids kept per loop pattern for reports (the latest ones).
LOOP_ID_WINDOW: Final = 64
_MAX_CHANNELS: Final = 64
#: Longest period (in events) the repeated-cycle counter looks for.
CYCLE_MAX_PERIOD: Final = 24
_SIG_POS_CAP: Final = 8 * CYCLE_MAX_PERIOD
_CHECKED: Final = operator.itemgetter("id", "t", "tokens", "usd")
_FIELDS: Final = operator.itemgetter(
    "id", "t", "tokens", "usd", "type", "agent", "content_ref", "tool", "to", "value", "error"
)

#: Loop patterns (names as reported by the safety net), after OpenHands' stuck detector.
LOOP_PATTERNS: Final[tuple[str, ...]] = (
    "repeated_action_observation",
    "repeated_action_error",
    "monologue",
    "alternating_actions",
    "repeated_cycle",
    "repeated_reply",
    "near_repeat",
)
#: Two texts whose sketches are at least this alike count as the same for ``near_repeat``: strict
#: (issue 37: loose settings chosen on one SWE set lost 3-6 points of success on another).
NEAR_SIMILARITY: Final = 0.9
#: Steps (action, result) the content features look back over: similarity and novelty.
CONTENT_WINDOW: Final = 8
#: A result at least this alike (by sketch) to an earlier one in the window is not novel (the
#: threshold issue 37's measurements of repeats on real runs used).
NOVEL_SIMILARITY: Final = 0.8
#: Event ids kept per agent for the repeated-reply report.
_REPLY_ID_WINDOW: Final = 8

# Features in blocks: (group, names), in the order of the feature vector. A group may come back
# in a later block (features added later go at the end: a model's feature order never moves).
_BLOCKS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    (
        "progress",
        (
            "elapsed_s",
            "turn",
            "n_events",
            *(f"n_{kind}" for kind in EVENT_TYPES),
            "agents_seen",
            "agents_active",
            "delegations_pending",
            "seconds_last_event",
            "seconds_per_turn",
        ),
    ),
    (
        "spend",
        (
            "tokens",
            "usd",
            "tokens_per_turn",
            "usd_per_turn",
            "tokens_last_turn",
            "budget_share_turns",
            "budget_share_seconds",
            "budget_share_tokens",
            "budget_share_usd",
        ),
    ),
    ("errors", ("errors_total", "errors_consecutive", "error_share_recent")),
    (
        "repetition",
        (
            "latest_ref_count",
            "identical_run",
            "identical_run_max",
            "distinct_ref_ratio",
            "abab_flag",
            "same_result_run",
            "same_error_run",
            "monologue_run",
            "alternation_len",
            "cycle_repeats",
            "repeated_reply_run",
        ),
    ),
    ("consensus", ("consensus_share", "consensus_agents")),
    ("rewards", ("reward_latest", "reward_best", "reward_delta", "turns_since_best", "tokens_since_best")),
    (
        "structure",
        (
            *(f"topology_{name}" for name in TOPOLOGIES),
            "stop_proposals",
            "turns_since_proposal",
            "rounds_at_best",
        ),
    ),
    # progress on real runs: scale-free (shares and ratios), so they transfer across systems
    (
        "real_runs",
        (
            "proposals_rejected",
            "turns_since_new_result",
            "error_share_total",
            "tokens_last_turn_ratio",
            "tokens_share_since_best",
        ),
    ),
    # the reward's trend: a run still improving is not done
    ("rewards", ("reward_gain_recent", "reward_improving_run")),
    # what the run's content shows (sketches and progress, when the events carry them; else NaN)
    (
        "content",
        (
            "near_repeat_run",
            "result_similarity_max",
            "action_similarity_max",
            "novelty_recent",
            "steps_since_progress",
            "tests_failing_share",
            "ledger_stall_run",
        ),
    ),
)

FEATURE_NAMES: Final[tuple[str, ...]] = tuple(name for _, names in _BLOCKS for name in names)

#: Features grouped by what they describe (docs/features.md; the trainer's ablation table).
FEATURE_GROUPS: Final[dict[str, tuple[str, ...]]] = {
    group: tuple(n for g, names in _BLOCKS if g == group for n in names) for group, _ in _BLOCKS
}

#: Features measured in a system's own absolute units (seconds, tokens, dollars): they tell
#: a 1k-token system from a 1M-token one, so a model meant to transfer between systems
#: leaves them out (see :func:`scale_free_features`).
ABSOLUTE_SCALE_FEATURES: Final[tuple[str, ...]] = (
    "elapsed_s",
    "seconds_last_event",
    "seconds_per_turn",
    "tokens",
    "usd",
    "tokens_per_turn",
    "usd_per_turn",
    "tokens_last_turn",
    "tokens_since_best",
)


#: The budget shares: how much of a cap in force is used (NaN without a budget).
BUDGET_SHARE_FEATURES: Final[tuple[str, ...]] = (
    "budget_share_turns",
    "budget_share_seconds",
    "budget_share_tokens",
    "budget_share_usd",
)


def scale_free_features(*, topology: bool = False) -> tuple[str, ...]:
    """Feature names without absolute sizes or budget shares (nor topology one-hots unless asked).

    What a model trained across systems whose runs cost 1k and 1M tokens should read: counts,
    shares and ratios. Most users never send a topology, so a transferable model ignores it;
    and a budget share tells where a corpus's cap falls (MINT's 5 turns, InterCode's 10), which
    a model meant for systems with other caps, or none, must not learn as the end of every run.
    """
    drop = set(ABSOLUTE_SCALE_FEATURES) | set(BUDGET_SHARE_FEATURES)
    if not topology:
        drop |= {n for n in FEATURE_NAMES if n.startswith("topology_")}
    return tuple(n for n in FEATURE_NAMES if n not in drop)


_N_FEATURES: Final = len(FEATURE_NAMES)
#: Events that are work, not an answer or a verdict: after a proposed stop they mean it was not taken.
_WORK_KINDS: Final = frozenset({"spawn", "delegate", "communicate", "tool_use", "aggregate"})
_TOPOLOGY_INDEX: Final = {name: i for i, name in enumerate(TOPOLOGIES)}

# a finished action: ((agent, tool, action ref), result ref, failed, event ids)
_Pair = tuple[tuple[str, str | None, str | None], str | None, bool, tuple[str, ...]]
#: (agent, tool, action ref, action sketch, result ref, result sketch, result progress key)
_Near = tuple[str, str | None, str | None, str | None, str | None, str | None, Any]
# an event's signature for the repeated-cycle counter: (agent, type, tool, to, ref, value, error)
_Sig = tuple[str, str, str | None, str | None, str | None, float | None, bool | None]


def _digest(ref: str) -> str:
    return "blake2b:" + hashlib.blake2b(ref.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _share(used: float, cap: float | None) -> float:
    if cap is None:
        return _NAN
    if cap <= 0:
        return 1.0
    return used / cap


class RunState:
    """Everything the stop policy knows about one run, folded one event at a time.

    ``topology`` is the run's format-v1 topology (one-hot features); ``budget`` the
    caps in force (budget-share features are ``NaN`` without one).

    :meth:`fold` returns ``False`` and changes nothing for an event id folded
    recently (a retried request). It raises :class:`TraceValidationError`, before
    changing anything, for an event that breaks the format: time going backwards,
    negative or non-finite ``tokens``/``usd``.
    """

    __slots__ = (
        "_act_sim",
        "_act_sketches",
        "_active_window",
        "_agent_ret_ref",
        "_agents",
        "_agg_ref",
        "_agg_repeat",
        "_alt_len",
        "_at_best",
        "_best",
        "_best_tokens",
        "_best_turn",
        "_budget",
        "_channel_latest",
        "_consensus_count",
        "_consensus_freq",
        "_consensus_max",
        "_counts",
        "_cyc_len",
        "_cyc_period",
        "_err_consec",
        "_err_total",
        "_err_window",
        "_ident_max",
        "_ident_run",
        "_ident_sig",
        "_ids",
        "_improving_run",
        "_last_dt",
        "_last_new_result_turn",
        "_last_proposal_turn",
        "_last_ref",
        "_last_t",
        "_latest",
        "_ledger_loop_run",
        "_ledger_stall_run",
        "_ledger_turns",
        "_max_agents",
        "_mono_agent",
        "_mono_ids",
        "_mono_ref",
        "_mono_run",
        "_n_events",
        "_near_prev",
        "_near_run",
        "_new_content",
        "_novel",
        "_pairs",
        "_pending",
        "_pending_action",
        "_prev_reward",
        "_primary_channel",
        "_prog_last",
        "_prog_steps",
        "_proposal_open",
        "_proposals",
        "_quiet",
        "_ref_counts",
        "_ref_window",
        "_refs_recent",
        "_rejected",
        "_reply_agent",
        "_reply_ids",
        "_reply_last",
        "_reply_mark",
        "_reply_run",
        "_res_sim",
        "_res_sketches",
        "_rewards_recent",
        "_same_err_run",
        "_same_res_run",
        "_seen_window",
        "_sig_pos",
        "_sigs",
        "_step_new",
        "_step_refs",
        "_tests_share",
        "_tokens",
        "_tokens_at_turn",
        "_tokens_last_turn",
        "_topology",
        "_turn",
        "_usd",
    )

    def __init__(
        self,
        topology: str | None = None,
        budget: Budget | None = None,
        *,
        seen_window: int = 4096,
        ref_window: int = 1024,
        max_agents: int = 1024,
    ) -> None:
        if topology is not None and topology not in _TOPOLOGY_INDEX:
            raise TraceValidationError(
                f"unknown topology {topology!r}",
                [Issue(f"{topology!r} is not one of {', '.join(TOPOLOGIES)}", path="topology")],
            )
        self._topology = topology
        self._budget = budget
        self._seen_window = max(1, seen_window)
        self._ref_window = max(1, ref_window)
        self._max_agents = max(1, max_agents)
        # insertion-ordered; compacted to the newest seen_window ids at 2 x seen_window
        self._ids: dict[str, None] = {}
        self._n_events = 0
        self._turn = 0
        self._counts = dict.fromkeys(EVENT_TYPES, 0)
        self._last_t: float | None = None
        self._last_dt = 0.0
        self._agents: set[str] = set()
        self._active_window: deque[str] = deque(maxlen=16)
        self._pending = 0
        self._tokens = 0
        self._usd = 0.0
        self._tokens_at_turn = 0
        self._tokens_last_turn = 0
        self._err_total = 0
        self._err_consec = 0
        self._err_window: deque[bool] = deque(maxlen=ERROR_WINDOW)
        # recency-ordered (a hit re-inserts); compacted to the newest ref_window at 2 x
        self._ref_counts: dict[str, int] = {}
        # long enough for both the distinct-ref ratio and the cycle's content check
        self._refs_recent: deque[str | None] = deque(maxlen=max(REF_RATIO_WINDOW, CYCLE_MAX_PERIOD))
        self._last_ref: str | None = None
        self._ident_sig: tuple[str, str, str | None, str | None] | None = None
        self._ident_run = 0
        self._ident_max = 0
        # loop detector: completed (action, result) pairs
        self._pending_action: Event | None = None
        self._pairs: deque[_Pair] = deque(maxlen=LOOP_ID_WINDOW // 2)
        self._same_res_run = 0
        self._same_err_run = 0
        self._alt_len = 0
        # near repeats: the last (action, result) as (agent, tool, ref, sketch, result ref, sketch, progress)
        self._near_prev: _Near | None = None
        self._near_run = 0
        # content features: the last steps' sketches (actions, results), the latest step's
        # similarity to them, and which of the last results were novel
        self._act_sketches: deque[str] = deque(maxlen=CONTENT_WINDOW)
        self._res_sketches: deque[str] = deque(maxlen=CONTENT_WINDOW)
        # None, not NaN, for "unknown" (a slot compares equal to its restored twin)
        self._act_sim: float | None = None
        self._res_sim: float | None = None
        self._novel: deque[bool] = deque(maxlen=CONTENT_WINDOW)
        # progress: the latest step that carried a progress reading, steps since one showed a step
        # forward (or since the first reading), the latest failing-test share
        self._prog_last: _ProgressKey | None = None
        self._prog_steps = 0
        self._tests_share: float | None = None
        self._mono_run = 0
        self._mono_agent: str | None = None
        self._mono_ref: str | None = None
        self._mono_ids: deque[str] = deque(maxlen=LOOP_ID_WINDOW)
        # repeated reply: per agent, its latest reply's ref and how often it came in a row
        # (other agents may speak between); a reply is a message or a return answering no action
        self._reply_last: dict[str, str] = {}
        self._reply_run: dict[str, int] = {}
        self._reply_ids: dict[str, deque[str]] = {}
        self._reply_agent: str | None = None
        # events with content not seen before, so far; per agent, that count at its latest reply
        # (a reply repeated while the others bring new content is no loop: a critic's stock
        # feedback to an actor that keeps trying new things)
        self._new_content = 0
        self._reply_mark: dict[str, int] = {}
        # repeated cycle: event signatures of the last CYCLE_MAX_PERIOD events
        self._sigs: deque[_Sig] = deque(maxlen=CYCLE_MAX_PERIOD)
        self._sig_pos: dict[_Sig, int] = {}

        self._cyc_period = 0
        self._cyc_len = 0
        # consensus: latest return ref per agent
        self._agent_ret_ref: dict[str, str] = {}
        self._consensus_count: dict[str, int] = {}
        self._consensus_freq: dict[int, int] = {}
        self._consensus_max = 0
        # rewards
        self._primary_channel: str | None = None
        self._channel_latest: dict[str, float] = {}
        self._latest: float | None = None
        self._prev_reward: float | None = None
        # the primary channel's latest rewards (trend) and its run of improvements
        self._rewards_recent: deque[float] = deque(maxlen=REWARD_TREND_WINDOW)
        self._improving_run = 0
        self._best: float | None = None
        self._best_turn = 0
        self._best_tokens = 0
        # rounds that kept the best reward: the evidence that it is the run's ceiling
        self._at_best = 0
        self._agg_ref: str | None = None
        self._agg_repeat = False
        # structure
        self._proposals = 0
        self._last_proposal_turn: int | None = None
        # a proposed stop the run went on from (the next decision point came): rejected
        self._proposal_open = False
        self._rejected = 0
        # the turn of the latest result (return or aggregate) whose content had not been seen
        self._last_new_result_turn: int | None = None
        # stall evidence (stopserve.evidence): did the step in progress carry content, new content;
        # agent steps in a row whose content was all seen before (a step with no content resets it)
        self._step_refs = False
        self._step_new = False
        self._quiet = 0
        # orchestrator ledger (the progress helper's block): an orchestrator's own verdict, read from
        # Event.progress made_progress / in_loop (Magentic-One's progress ledger), for the
        # orchestrator_ledger rule (stopserve.safety)
        self._ledger_turns = 0
        self._ledger_loop_run = 0
        self._ledger_stall_run = 0

    # ------------------------------------------------------------------ folding

    def set_budget(self, budget: Budget | None) -> None:
        """Set (or clear) the caps the budget-share features are measured against."""
        self._budget = budget

    def fold_many(self, events: Iterable[Event]) -> int:
        """Fold events in order; return how many were new (retried ids are skipped).

        The batch is checked first (time order, costs), so a bad batch raises
        before any of it is folded.
        """
        batch = events if isinstance(events, list | tuple) else list(events)
        last_t = self._last_t
        fresh: set[str] = set()
        ids = self._ids
        for i, event in enumerate(batch):
            eid, t, tok, usd = _CHECKED(event.__dict__)
            if eid in ids or eid in fresh:
                continue
            fresh.add(eid)
            if (
                not 0.0 <= t < _INF
                or (last_t is not None and t < last_t)
                or (tok is not None and not 0 <= tok < _INF)
                or (usd is not None and not 0.0 <= usd < _INF)
            ):
                self._check(event, last_t, index=i)
            if event.type not in self._counts:
                self._check(event, last_t, index=i)
            last_t = t
        folded = 0
        for event in batch:
            folded += self.fold(event)
        return folded

    def _check(self, event: Event, last_t: float | None, index: int | None = None) -> None:
        where = f"events[{index}]" if index is not None else f"event {event.id!r}"
        problems: list[Issue] = []
        t = event.t
        if not (t >= 0 and t != math.inf):
            problems.append(Issue(f"t must be a finite number >= 0, got {t}", path=f"{where}.t"))
        elif last_t is not None and t < last_t:
            problems.append(Issue(f"time goes backwards: {t} after {last_t}", path=f"{where}.t"))
        tok = event.tokens
        if tok is not None and not (tok >= 0 and tok != math.inf):
            problems.append(Issue(f"tokens must be >= 0, got {tok}", path=f"{where}.tokens"))
        usd = event.usd
        if usd is not None and not (usd >= 0 and usd != math.inf):
            problems.append(Issue(f"usd must be a finite number >= 0, got {usd}", path=f"{where}.usd"))
        if event.type not in EVENT_TYPES:
            problems.append(
                Issue(f"{event.type!r} is not one of {', '.join(EVENT_TYPES)}", path=f"{where}.type")
            )
        if problems:
            raise TraceValidationError(f"event {event.id!r} cannot be folded", problems)

    def fold(self, event: Event) -> bool:
        """Fold one event; ``False`` (nothing changed) when its id was folded recently."""
        # hot path (>= 300k events/s): locals, no numpy, no allocation that grows
        # one C call reads every field: pydantic attribute access costs ~3x a dict lookup
        eid, t, tok, usd, kind, agent, ref, tool, to, value, err = _FIELDS(event.__dict__)
        ids = self._ids
        if eid in ids:
            return False
        last_t = self._last_t
        # validated events pass in a few comparisons; constructed ones may carry anything
        if (
            not 0.0 <= t < _INF
            or (last_t is not None and t < last_t)
            or (tok is not None and not 0 <= tok < _INF)
            or (usd is not None and not 0.0 <= usd < _INF)
            or kind not in self._counts
        ):
            self._check(event, last_t)

        ids[eid] = None
        if len(ids) > self._seen_window << 1:
            self._ids = dict.fromkeys(list(ids)[-self._seen_window :])

        self._n_events += 1
        self._counts[kind] += 1
        if last_t is not None:
            self._last_dt = t - last_t
        self._last_t = t
        if tok:
            self._tokens += tok
        if usd:
            self._usd += usd
        agents = self._agents
        if agent not in agents and len(agents) < self._max_agents:
            agents.add(agent)
        self._active_window.append(agent)
        prog = event.__dict__["progress"]
        if prog is not None:
            self._ledger(prog)

        new_result = False
        if ref is not None:
            if len(ref) > MAX_REF_CHARS:
                ref = _digest(ref)
            counts = self._ref_counts
            seen_before = counts.pop(ref, 0)
            counts[ref] = seen_before + 1
            new_result = not seen_before and kind in {"return", "aggregate"}
            self._step_refs = True
            if not seen_before:
                self._step_new = True
                self._new_content += 1
            if len(counts) > self._ref_window << 1:
                self._ref_counts = dict(list(counts.items())[-self._ref_window :])
            self._last_ref = ref
            sig = (agent, kind, tool, ref)
            if sig == self._ident_sig:
                run = self._ident_run = self._ident_run + 1
                self._ident_max = max(self._ident_max, run)
            else:
                self._ident_sig = sig
                self._ident_run = 1
        else:
            self._ident_sig = None
            self._ident_run = 1
        if not self._ident_max:
            self._ident_max = 1
        self._refs_recent.append(ref)

        # repeated cycle: this event repeats the one `period` events back, as its predecessors did
        # (the signature itself, not its hash(): str hashes are salted per process, and a run's
        # state moves between processes with to_bytes)
        csig = (agent, kind, tool, to, ref, value, err)
        index = self._n_events - 1
        period = self._cyc_period
        if period and self._sigs[-period] == csig:
            self._cyc_len += 1
        else:
            pos = self._sig_pos.get(csig)
            if pos is not None and index - pos <= CYCLE_MAX_PERIOD:
                self._cyc_period = index - pos
                self._cyc_len = 1
            elif period:
                self._cyc_period = self._cyc_len = 0
        self._sigs.append(csig)
        positions = self._sig_pos
        positions[csig] = index
        if len(positions) > _SIG_POS_CAP:
            cutoff = index - CYCLE_MAX_PERIOD
            self._sig_pos = {k: v for k, v in positions.items() if v >= cutoff}

        if self._proposal_open and kind in _WORK_KINDS:
            self._rejected += 1  # the run went back to work after a proposed stop: not taken
            self._proposal_open = False

        if err is not None or kind == "return":
            if err:
                self._err_window.append(True)
                self._err_consec += 1
                self._err_total += 1
            else:
                self._err_window.append(False)
                self._err_consec = 0

        if kind == "communicate" or (kind == "return" and self._pending_action is None):
            self._reply(agent, ref, eid)

        # monologue: the same message by one agent, nothing in between
        if kind == "communicate":
            if ref is not None and self._mono_run and ref == self._mono_ref and agent == self._mono_agent:
                self._mono_run += 1
                self._mono_ids.append(eid)
            elif ref is not None:
                self._mono_run = 1
                self._mono_agent = agent
                self._mono_ref = ref
                self._mono_ids.clear()
                self._mono_ids.append(eid)
            else:
                self._mono_run = 0
            return True
        if self._mono_run:
            self._mono_run = 0

        if kind == "tool_use":
            pending = self._pending_action
            if pending is not None:
                self._complete(pending, None, None, bool(pending.error), None)
            self._pending_action = event
            return True
        if kind == "return":
            action = self._pending_action
            if action is not None:
                self._pending_action = None
                self._complete(action, eid, ref, bool(err) or bool(action.error), event)
            if self._pending > 0:
                self._pending -= 1
            if ref is not None:
                self._consensus_update(agent, ref)
        elif kind == "reward":
            # a decision point, but not an agent step: a reward never counts as a turn
            self._reward(event)
            return True
        elif kind == "stop":
            if not event.proposed:
                return True
            self._proposals += 1
            self._last_proposal_turn = self._turn + 1
            if self._proposal_open:
                self._rejected += 1  # a proposal after a proposal: the first was not taken
            self._proposal_open = True
        elif kind == "delegate":
            self._pending += 1
            return True
        elif kind != "aggregate":
            return True
        else:
            # an answer repeating the previous one is a stuck round: no evidence on the ceiling
            self._agg_repeat = ref is not None and ref == self._agg_ref
            self._agg_ref = ref
        # an agent step ends with this event (a decision point follows it: stopserve.trace.is_decision_point)
        if new_result:
            self._last_new_result_turn = self._turn + 1
        self._quiet = self._quiet + 1 if self._step_refs and not self._step_new else 0
        self._step_refs = self._step_new = False
        self._turn += 1
        tokens = self._tokens
        self._tokens_last_turn = tokens - self._tokens_at_turn
        self._tokens_at_turn = tokens
        return True

    def _ledger(self, prog: Progress) -> None:
        """An orchestrator's own verdict on this event (orchestrator ledger block): count its turns in a row.

        A ledger turn is an event whose progress carries ``in_loop`` or ``made_progress``. A stall
        is what Magentic-One itself counts as one: progress not being made, or the team in a loop.
        """
        in_loop, made = prog.in_loop, prog.made_progress
        if in_loop is None and made is None:
            return
        self._ledger_turns += 1
        self._ledger_loop_run = self._ledger_loop_run + 1 if in_loop else 0
        self._ledger_stall_run = self._ledger_stall_run + 1 if in_loop or made is False else 0

    def _reply(self, agent: str, ref: str | None, eid: str) -> None:
        """An agent's reply (a message, or a result that answers no action): count repeats per agent."""
        last = self._reply_last
        if agent not in last and len(last) >= self._max_agents:
            return
        self._reply_agent = agent
        ids = self._reply_ids.get(agent)
        if ids is None:
            ids = self._reply_ids[agent] = deque(maxlen=_REPLY_ID_WINDOW)
        if ref is None:
            self._reply_run[agent] = 0
            last.pop(agent, None)
            ids.clear()
            return
        fresh = self._new_content
        if last.get(agent) == ref and self._reply_mark.get(agent) == fresh:
            self._reply_run[agent] += 1
        else:
            # a new reply, or the same one after the others brought something new: no repeat yet
            self._reply_run[agent] = 1
            last[agent] = ref
            ids.clear()
        self._reply_mark[agent] = fresh
        ids.append(eid)

    def _complete(
        self, action: Event, result_id: str | None, result_ref: str | None, failed: bool, result: Event | None
    ) -> None:
        """Record one finished (action, result) pair and update the loop run lengths."""
        aref = action.content_ref
        if aref is not None and len(aref) > MAX_REF_CHARS:
            aref = _digest(aref)
        self._near(action, aref, result, result_ref, failed)
        asig = (action.agent, action.tool, aref)
        pairs = self._pairs
        ids = (action.id,) if result_id is None else (action.id, result_id)
        if aref is None:
            # unknown content never counts as "the same": false stops cost more
            self._same_res_run = self._same_err_run = self._alt_len = 0
            pairs.append((asig, result_ref, failed, ids))
            return
        prev = pairs[-1] if pairs else None
        if prev is not None and prev[0] == asig:
            if result_ref is not None and prev[1] == result_ref:
                self._same_res_run += 1
            else:
                self._same_res_run = 1 if result_ref is not None else 0
            self._same_err_run = self._same_err_run + 1 if failed and prev[2] else int(failed)
            self._alt_len = 0
        else:
            self._same_res_run = 1 if result_ref is not None else 0
            self._same_err_run = int(failed)
            if (
                prev is not None
                and prev[0][2] is not None
                and len(pairs) >= 2
                and pairs[-2][0] == asig
                and pairs[-2][1] == result_ref
            ):
                self._alt_len = self._alt_len + 1 if self._alt_len else 3
            else:
                self._alt_len = 0
        pairs.append((asig, result_ref, failed, ids))

    def _near(
        self, action: Event, aref: str | None, result: Event | None, result_ref: str | None, failed: bool
    ) -> None:
        """``near_repeat``: this pair is the last one again, near enough, and shows no progress.

        Near enough: the same agent and tool, and one side the same while the other is as
        alike as :data:`NEAR_SIMILARITY` by its sketch: a command or search rephrased, with
        the same result; or the same action *failing* with a near result (a traceback with
        another timestamp, path or line; sketches fold digits, so a result that changed only
        in its numbers, a counter or a progress log, is no repeat unless it is an error), the
        same error signature where the steps carry one. Both sides near is no repeat (a probe
        of ``probe_2.py`` failing on ``field_2`` after ``probe_1.py`` explores). No progress:
        fewer failing tests, more passing, a file changed, an exit code back to 0, the
        orchestrator's "progress" reset the count. Unknown content never counts: false stops cost more.
        """
        adict = action.__dict__
        rdict = None if result is None else result.__dict__
        cur: _Near = (
            action.agent,
            action.tool,
            aref,
            adict.get("sketch"),
            result_ref,
            None if rdict is None else rdict.get("sketch"),
            _progress_key(None if rdict is None else rdict.get("progress"), failed),
        )
        self._content(cur)
        prev = self._near_prev
        self._near_prev = cur
        if result_ref is None or (aref is None and cur[3] is None):
            self._near_run = 0
        elif (
            prev is not None
            and prev[0] == cur[0]
            and prev[1] == cur[1]
            and _near_pair(prev, cur)
            and not _progressed(prev[6], cur[6])
        ):
            self._near_run += 1
        else:
            self._near_run = 1

    def _content(self, cur: _Near) -> None:
        """The content features of one finished step: its similarity to the last steps, its novelty,
        and what its progress reading shows (the "content" block; NaN where the events carry none)."""
        sk_act, sk_res, key = cur[3], cur[5], cur[6]
        sim_act = _max_similarity(sk_act, self._act_sketches)
        sim = _max_similarity(sk_res, self._res_sketches)
        self._act_sim = None if math.isnan(sim_act) else sim_act
        self._res_sim = None if math.isnan(sim) else sim
        if sk_act is not None:
            self._act_sketches.append(sk_act)
        if sk_res is not None:
            self._novel.append(not sim >= NOVEL_SIMILARITY)  # the first result (NaN) is novel
            self._res_sketches.append(sk_res)
        known = any(v is not None for v in key[:6])
        last = self._prog_last
        if known:
            self._prog_steps = 0 if last is None or _progressed(last, key) else self._prog_steps + 1
            self._prog_last = key
            passed, failed = key[0], key[1]
            if passed is not None and failed is not None and passed + failed > 0:
                self._tests_share = failed / (passed + failed)
        elif last is not None:
            self._prog_steps += 1

    def _consensus_update(self, agent: str, ref: str | None) -> None:
        latest = self._agent_ret_ref
        old = latest.get(agent)
        if ref is None or old == ref:
            return
        if old is None and len(latest) >= self._max_agents:
            return
        count = self._consensus_count
        freq = self._consensus_freq
        if old is not None:
            c = count[old]
            freq[c] -= 1
            if c == self._consensus_max and freq[c] == 0:
                self._consensus_max = c - 1
            if c == 1:
                del count[old]
            else:
                count[old] = c - 1
                freq[c - 1] = freq.get(c - 1, 0) + 1
        c = count.get(ref, 0)
        if c:
            freq[c] -= 1
        count[ref] = c + 1
        freq[c + 1] = freq.get(c + 1, 0) + 1
        self._consensus_max = max(self._consensus_max, c + 1)
        latest[agent] = ref

    def _reward(self, event: Event) -> None:
        value = event.value
        if value is None or math.isnan(value):
            return
        channel = event.channel or "quality"
        if self._primary_channel is None:
            self._primary_channel = channel
        if channel in self._channel_latest or len(self._channel_latest) < _MAX_CHANNELS:
            self._channel_latest[channel] = value
        if channel != self._primary_channel:
            return
        self._prev_reward = self._latest
        self._latest = value
        self._rewards_recent.append(value)
        prev = self._prev_reward
        self._improving_run = self._improving_run + 1 if prev is not None and value > prev else 0
        if self._best is None or value > self._best:
            self._best = value
            self._best_turn = self._turn
            self._best_tokens = self._tokens
            self._at_best = 0
        elif value == self._best and self._prev_reward == value and not self._agg_repeat:
            self._at_best += 1

    # ------------------------------------------------------------------ reading

    def features(self) -> npt.NDArray[np.float64]:
        """The feature vector now, in ``FEATURE_NAMES`` order (a fresh array)."""
        turn = self._turn
        per_turn = turn if turn > 0 else 1
        elapsed = self._last_t or 0.0
        budget = self._budget
        if budget is None:
            shares = [_NAN, _NAN, _NAN, _NAN]
        else:
            shares = [
                _share(turn, budget.max_turns),
                _share(elapsed, budget.max_seconds),
                _share(self._tokens, budget.max_tokens),
                _share(self._usd, budget.max_usd),
            ]
        window = self._err_window
        recent = list(self._refs_recent)[-REF_RATIO_WINDOW:]
        n_recent = len(recent)
        distinct = len({r for r in recent if r is not None})
        n_agents_ret = len(self._agent_ret_ref)
        latest = self._latest
        best = self._best
        prev = self._prev_reward
        topo = [0.0] * len(TOPOLOGIES)
        if self._topology is not None:
            topo[_TOPOLOGY_INDEX[self._topology]] = 1.0
        values: list[float] = [
            elapsed,
            turn,
            self._n_events,
            *self._counts.values(),
            len(self._agents),
            len(set(self._active_window)),
            self._pending,
            self._last_dt,
            elapsed / per_turn,
            self._tokens,
            self._usd,
            self._tokens / per_turn,
            self._usd / per_turn,
            self._tokens_last_turn,
            *shares,
            self._err_total,
            self._err_consec,
            sum(window) / len(window) if window else 0.0,
            self._ref_counts.get(self._last_ref, 0) if self._last_ref is not None else 0,
            self._ident_run,
            self._ident_max,
            distinct / n_recent if n_recent else 0.0,
            1.0 if self._alt_len >= 4 else 0.0,
            self._same_res_run,
            self._same_err_run,
            self._mono_run,
            self._alt_len,
            self._cycle_repeats(),
            self.loop_run("repeated_reply"),
            self._consensus_max / n_agents_ret if n_agents_ret else _NAN,
            n_agents_ret,
            _NAN if latest is None else latest,
            _NAN if best is None else best,
            _NAN if latest is None or prev is None else latest - prev,
            _NAN if best is None else turn - self._best_turn,
            _NAN if best is None else self._tokens - self._best_tokens,
            *topo,
            self._proposals,
            _NAN if self._last_proposal_turn is None else turn - self._last_proposal_turn,
            _NAN if best is None else self._at_best,
            self._rejected,
            _NAN if self._last_new_result_turn is None else turn - self._last_new_result_turn,
            self._err_total / per_turn,
            self._tokens_last_turn * per_turn / self._tokens if self._tokens else _NAN,
            _NAN if best is None or not self._tokens else (self._tokens - self._best_tokens) / self._tokens,
            self._reward_gain_recent(),
            self._improving_run,
            self._near_run,
            _NAN if self._res_sim is None else self._res_sim,
            _NAN if self._act_sim is None else self._act_sim,
            sum(self._novel) / len(self._novel) if self._novel else _NAN,
            _NAN if self._prog_last is None else self._prog_steps,
            _NAN if self._tests_share is None else self._tests_share,
            self._ledger_stall_run if self._ledger_turns else _NAN,
        ]
        # fromiter: 3x faster than np.array on a short list of mixed ints and floats
        return np.fromiter(values, dtype=np.float64, count=_N_FEATURES)

    def _reward_gain_recent(self) -> float:
        recent = self._rewards_recent
        if len(recent) < 2:
            return _NAN
        return (recent[-1] - recent[0]) / (len(recent) - 1)

    def feature_dict(self) -> dict[str, float]:
        """The features by name (for humans and logs)."""
        return dict(zip(FEATURE_NAMES, self.features().tolist(), strict=True))

    def seen(self, event_id: str) -> bool:
        """Whether ``event_id`` was folded recently (always true for the newest ``seen_window``)."""
        return event_id in self._ids

    @property
    def topology(self) -> str | None:
        """The run's topology, as given."""
        return self._topology

    @property
    def budget(self) -> Budget | None:
        """The caps in force, as given."""
        return self._budget

    @property
    def n_events(self) -> int:
        """Events folded (retries not counted)."""
        return self._n_events

    @property
    def turn(self) -> int:
        """Agent steps folded so far: ``return``, ``aggregate`` and proposed ``stop`` events.

        A step is a tool call with its result, an agent's reply handed back, a combined
        answer or a proposed stop; a ``reward`` (a decision point, but bookkeeping) is not one.
        """
        return self._turn

    @property
    def elapsed(self) -> float:
        """Seconds since the run started (``t`` of the latest event)."""
        return self._last_t or 0.0

    @property
    def tokens(self) -> int:
        """Tokens spent so far."""
        return self._tokens

    @property
    def usd(self) -> float:
        """Money spent so far (USD)."""
        return self._usd

    @property
    def latest_reward(self) -> float | None:
        """Latest reward on the run's primary channel (the first one seen), or ``None``."""
        return self._latest

    @property
    def best_reward(self) -> float | None:
        """Best reward so far on the primary channel, or ``None``."""
        return self._best

    @property
    def steps_since_new_content(self) -> int:
        """Agent steps in a row whose content (commands, outputs, messages) had all been seen before.

        A step that carried no content ref resets it: unknown content is no evidence of a stall.
        """
        return self._quiet

    @property
    def steps_since_best_reward(self) -> int | None:
        """Agent steps since the primary channel's best reward (``None`` before any reward)."""
        return None if self._best is None else self._turn - self._best_turn

    # orchestrator ledger views (read by stopserve.safety's orchestrator_ledger rule)

    @property
    def ledger_turns(self) -> int:
        """Events carrying an orchestrator's own verdict (``progress.in_loop`` / ``made_progress``)."""
        return self._ledger_turns

    @property
    def ledger_loop_run(self) -> int:
        """Ledger turns in a row, ending now, whose verdict was ``in_loop: true``."""
        return self._ledger_loop_run

    @property
    def ledger_stall_run(self) -> int:
        """Ledger turns in a row, ending now, that stalled: ``made_progress: false`` or ``in_loop: true``."""
        return self._ledger_stall_run

    def latest_reward_on(self, channel: str | None = None) -> float | None:
        """Latest reward on ``channel`` (``None``: the primary channel)."""
        if channel is None:
            return self._latest
        return self._channel_latest.get(channel)

    # loop detector views (read by stopserve.safety)

    def loop_run(self, pattern: str) -> int:
        """Current length of a loop pattern (see ``LOOP_PATTERNS``).

        ``repeated_action_observation``: identical (action, result) pairs in a row;
        ``repeated_action_error``: the same action failing in a row;
        ``monologue``: the same message by one agent with nothing between;
        ``alternating_actions``: actions in an A-B-A-B... alternation;
        ``repeated_reply``: the latest reply's agent gave the same reply this many times in a
        row, other agents' events allowed between (a reply is a ``communicate``, or a
        ``return`` that answers no pending action: a text-only agent handing its turn back);
        ``near_repeat``: (action, result) pairs in a row that repeat the last one exactly or
        nearly, by the events' sketches (see ``_near``), and show no progress; 0 where the run is
        the exact patterns' (every pair an exact repeat, or the same action failing);
        ``repeated_cycle``: full repeats of the latest stretch of 2 to
        ``CYCLE_MAX_PERIOD`` events (same agent, type, tool, recipient, content ref,
        reward value and error flag), counted only when the stretch holds a content ref
        and is not a single action with its result (``repeated_action_observation``).
        """
        # one dict lookup: the nets ask for every pattern at every decision
        run: int = _LOOP_RUN[pattern](self)
        return run

    def _near_repeats(self) -> int:
        """The near-repeat run, where the exact patterns do not count it whole (else 0: theirs)."""
        run = self._near_run
        return run if run > self._same_res_run and run > self._same_err_run else 0

    def _reply_repeats(self) -> int:
        agent = self._reply_agent
        return 0 if agent is None else self._reply_run.get(agent, 0)

    def _cycle_repeats(self) -> int:
        """Full repeats of the current cycle; 0 unless some event in it carries a content ref."""
        period = self._cyc_period
        if period < 2:
            return 0  # one event repeating: the monologue and identical-run counters' business
        repeats = (self._cyc_len + period) // period
        if repeats < 2:
            return 0
        if period == 2 and self._same_res_run >= 2:
            return 0  # one action and its result: repeated_action_observation's business
        refs = self._refs_recent
        if any(refs[-k] is not None for k in range(1, period + 1)):
            return repeats
        return 0

    # ------------------------------------------------------------------ serialization

    def to_bytes(self) -> bytes:
        """The whole state as compact bytes (MessagePack of plain values, format version first).

        For a run whose state moves between processes (the service's shared run store):
        :meth:`from_bytes` in any process gives a state that folds on exactly as this one
        would. Never pickle: the bytes hold only numbers, strings, lists and maps, and
        :meth:`from_bytes` checks the format and version before it builds anything.

        >>> s = RunState(topology="harness")
        >>> s.fold(Event(id="a", t=0.0, type="tool_use", agent="x"))
        True
        >>> RunState.from_bytes(s.to_bytes()).n_events
        1
        """
        msgpack = _msgpack()
        slots = {name: _ENCODE.get(name, _plain)(getattr(self, name)) for name in _STATE_SLOTS}
        return bytes(msgpack.packb({"format": STATE_FORMAT, "version": STATE_VERSION, "slots": slots}))

    @classmethod
    def from_bytes(cls, data: bytes) -> RunState:
        """The state :meth:`to_bytes` wrote; ``ValueError`` naming what is wrong for anything else."""
        msgpack = _msgpack()
        try:
            doc = msgpack.unpackb(data, strict_map_key=False, use_list=True)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ValueError(f"not a serialized RunState: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            raise ValueError(f"not a serialized RunState (no {STATE_FORMAT!r} header)")
        version = doc.get("version")
        if version != STATE_VERSION:
            raise ValueError(
                f"RunState format version {version!r}, this stopserve reads version {STATE_VERSION} only"
            )
        slots = doc.get("slots")
        if not isinstance(slots, dict):
            raise ValueError("serialized RunState lacks its slots")
        missing = sorted(set(_STATE_SLOTS) - set(slots))
        if missing:
            raise ValueError(f"serialized RunState lacks {', '.join(missing)}")
        state = cls.__new__(cls)
        bounds = _deque_bounds()
        try:
            for name in _STATE_SLOTS:
                decode = _DECODE.get(name)
                value = slots[name]
                if decode is not None:
                    value = decode(value)
                elif name in bounds:  # a bounded deque: its bound is this version's
                    value = deque(value, maxlen=bounds[name])
                setattr(state, name, value)
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            raise ValueError(f"serialized RunState is malformed: {exc}") from None
        return state

    def loop_events(self, pattern: str) -> list[str]:
        """Ids of the events in the current run of ``pattern`` (the latest 64 at most)."""
        if pattern == "monologue":
            return list(self._mono_ids) if self._mono_run else []
        if pattern == "repeated_reply":
            agent = self._reply_agent
            return list(self._reply_ids.get(agent, ())) if agent is not None else []
        if pattern == "repeated_cycle":
            if not self._cycle_repeats():
                return []
            n = min(self._cyc_len + self._cyc_period, LOOP_ID_WINDOW)
            return list(self._ids)[-n:]
        run = self.loop_run(pattern)
        pairs = list(self._pairs)[-run:] if run else []
        return [eid for pair in pairs for eid in pair[3]]


_LOOP_RUN: Final[dict[str, Callable[[RunState], int]]] = {
    "repeated_action_observation": operator.attrgetter("_same_res_run"),
    "repeated_action_error": operator.attrgetter("_same_err_run"),
    "monologue": operator.attrgetter("_mono_run"),
    "alternating_actions": operator.attrgetter("_alt_len"),
    "repeated_cycle": RunState._cycle_repeats,
    "repeated_reply": RunState._reply_repeats,
    "near_repeat": RunState._near_repeats,
}


def _alike(ref_a: str | None, sk_a: str | None, ref_b: str | None, sk_b: str | None) -> bool:
    """The same content: equal refs, or sketches at least :data:`NEAR_SIMILARITY` alike."""
    if ref_a is not None and ref_a == ref_b:
        return True
    if sk_a is None or sk_b is None:
        return False
    if sk_a == sk_b:
        return True
    return _sketch.similarity(_sketch.parse(sk_a), _sketch.parse(sk_b)) >= NEAR_SIMILARITY


def _max_similarity(wire: str | None, earlier: Iterable[str]) -> float:
    """The highest similarity of sketch ``wire`` to the ``earlier`` ones (NaN: none to compare)."""
    if wire is None:
        return _NAN
    best = _NAN
    parsed: _sketch.Sketch | None = None
    for other in earlier:
        if other == wire:
            return 1.0
        if parsed is None:
            parsed = _sketch.parse(wire)
        sim = _sketch.similarity(parsed, _sketch.parse(other))
        if not sim <= best:  # NaN at first
            best = sim
    return best


def _near_pair(prev: _Near, cur: _Near) -> bool:
    """One side the same, the other the same or near: a rephrased action with the same result, or
    the same action failing with a near result. Both sides near is no repeat (a probe of
    ``probe_2.py`` failing on ``field_2`` after ``probe_1.py`` on ``field_1`` explores)."""
    same_action = cur[2] is not None and cur[2] == prev[2]
    same_result = cur[4] is not None and cur[4] == prev[4]
    if same_action:
        return same_result or _near_failure(prev, cur)
    return same_result and _alike(prev[2], prev[3], cur[2], cur[3])


def _near_failure(prev: _Near, cur: _Near) -> bool:
    """Both steps failed, with results as alike and the same error signature where they carry one."""
    before, now = prev[6], cur[6]
    if not (before[6] and now[6]):  # only failures may differ in their numbers
        return False
    if before[5] is not None and now[5] is not None and before[5] != now[5]:
        return False
    return _alike(None, prev[5], None, cur[5])


#: (tests passed, tests failed, exit code, files changed, made progress, error signature, failed)
_ProgressKey = tuple[int | None, int | None, int | None, int | None, bool | None, str | None, bool]


def _progress_key(prog: Progress | None, failed: bool) -> _ProgressKey:
    if prog is None:
        return (None, None, None, None, None, None, failed)
    return (
        prog.tests_passed,
        prog.tests_failed,
        prog.exit_code,
        prog.files_changed,
        prog.made_progress,
        prog.error,
        failed or prog.error is not None or prog.exit_code not in (None, 0),
    )


def _progressed(before: Sequence[Any], now: Sequence[Any]) -> bool:
    """Whether ``now``'s progress shows a step forward from ``before``'s."""
    passed, failed, code, files, made = now[:5]
    if made is True or (files is not None and files > 0):
        return True
    b_passed, b_failed, b_code = before[0], before[1], before[2]
    return (
        (failed is not None and b_failed is not None and failed < b_failed)
        or (passed is not None and b_passed is not None and passed > b_passed)
        or (code == 0 and b_code not in (None, 0))
    )


# ---------------------------------------------------------------------- serialization helpers

#: The header of :meth:`RunState.to_bytes`; a change of what a slot means bumps the version.
STATE_FORMAT: Final = "stopserve.runstate"
# 2: a reward no longer counts as a turn; 3: the orchestrator-ledger counters; 4: near repeats;
# 5: the content features (sketch similarity, novelty, progress)
STATE_VERSION: Final = 5
_STATE_SLOTS: Final[tuple[str, ...]] = RunState.__slots__


def _msgpack() -> Any:
    try:
        import msgpack
    except ImportError:  # pragma: no cover - the [redis] extra brings it
        raise ImportError("RunState.to_bytes/from_bytes need msgpack: the [redis] extra") from None
    return msgpack


@functools.cache
def _deque_bounds() -> dict[str, int | None]:
    """The bound of each deque slot, as this version sizes them."""
    fresh = RunState()
    return {n: v.maxlen for n in _STATE_SLOTS if isinstance(v := getattr(fresh, n), deque)}


def _plain(value: Any) -> Any:
    """Numbers, strings, None and maps of them go as they are; a deque as its items."""
    return list(value) if isinstance(value, deque) else value


def _pairs_in(raw: list[Any]) -> deque[_Pair]:
    return deque(
        (((a[0], a[1], a[2]), ref, failed, tuple(ids)) for a, ref, failed, ids in raw),
        maxlen=LOOP_ID_WINDOW // 2,
    )


def _near_in(raw: list[Any] | None) -> _Near | None:
    if raw is None:
        return None
    *head, prog = raw
    return (*head, tuple(prog))


def _sigs_in(raw: list[Any]) -> deque[_Sig]:
    return deque(map(tuple, raw), maxlen=CYCLE_MAX_PERIOD)


def _sig_pos_in(raw: list[Any]) -> dict[_Sig, int]:
    keys, positions = raw
    return dict(zip(map(tuple, keys), positions, strict=True))


_ENCODE: Final[dict[str, Callable[[Any], Any]]] = {
    "_budget": lambda b: None if b is None else b.model_dump(exclude_none=True),
    "_ids": list,
    "_agents": sorted,
    "_pending_action": lambda e: None if e is None else e.model_dump_json(by_alias=True, exclude_none=True),
    "_reply_ids": lambda d: {k: list(v) for k, v in d.items()},
    "_sig_pos": lambda d: [list(d), list(d.values())],
    "_sigs": lambda q: [list(k) for k in q],
    "_ident_sig": lambda t: None if t is None else list(t),
}
_DECODE: Final[dict[str, Callable[[Any], Any]]] = {
    "_budget": lambda b: None if b is None else Budget.model_validate(b),
    "_ids": dict.fromkeys,
    "_agents": set,
    "_pending_action": lambda e: None if e is None else Event.model_validate_json(e),
    "_pairs": _pairs_in,
    "_near_prev": _near_in,
    "_prog_last": lambda t: None if t is None else tuple(t),
    "_reply_ids": lambda d: {k: deque(v, maxlen=_REPLY_ID_WINDOW) for k, v in d.items()},
    "_sig_pos": _sig_pos_in,
    "_sigs": _sigs_in,
    "_ident_sig": lambda t: None if t is None else tuple(t),
}
