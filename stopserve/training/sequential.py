"""The sequential gate: evidence about one challenger carried from one retrain to the next.

One retrain's gate reads a bootstrap interval on one held-out set: a small gain needs a
large set to show. Here every held-out run a retrain judges a challenger on adds its paired
doubly robust difference ``x = DR(challenger) − DR(champion)`` to a **test martingale**
(Waudby-Smith & Ramdas, "Estimating means of bounded random variables by betting", JRSS-B
2023: the one-sided betting capital process with predictable plug-in empirical-Bernstein
bets; their package ``confseq`` has it as ``betting_lower_cs``, but builds C++ and brings
matplotlib, scipy and pandas: these few lines of numpy are what the gate needs)::

    K_t(m) = Π_{i ≤ t} (1 + λ_i(m) · (x_i − m)),   λ_i(m) = min(λ̂_i, c / (m + floor))

``λ̂_i`` reads only the runs before ``i`` (``sqrt(2 log(1/α) / (σ̂²_{i−1} · i · log(1+i)))``),
``c = 1/2`` and ``floor`` bounds the differences from below (``x ≥ −floor``). When the mean of
``x`` is at most ``m``, ``K_t(m)`` is a non-negative supermartingale that starts at 1, so by
Ville's inequality it ever reaches ``1/α`` with probability at most ``α``, however many runs
and rounds are added and whenever one looks. Hence:

* the **e-value** ``max_t K_t(0)`` (strictly the e-process's running maximum; ``K_t(0)`` now
  is ``capital``): the challenger is promoted once it reaches ``1/α``, and one no better than
  the champion is then promoted with probability at most ``α`` over all rounds together;
* the **lower bound** ``sup{m : max_t K_t(m) ≥ 1/α}``: a (1 − α) lower confidence sequence of
  the mean difference, valid at every round at once (``K_t(m)`` is non-increasing in ``m``).

What it needs: the runs are a stationary stream (the state is for one champion, the policy
that logged them, and one challenger: either changing starts it anew), each run's DR
difference is unbiased for the true one (the gate adds a round only when both figures are
supported by every rule but the least number of runs: none resting on the model alone or on a
few uneven weights; the logging policy may explore differently from round to round, each run
carries its own propensities), a run counts once (its id is kept), and ``x ≥ −floor``. It
needs no least number of runs: that sizes a bootstrap, and the martingale holds at any ``t``.
A run's value ``q − λ·c`` is in ``[−λ·c, 1]``, so on a run judged exactly
``x ≥ −(1 + λ·c_final)``, and through an importance weight ``w`` about ``−w·(1 + λ·c_final)``:
the floor is ``max(1, w_max)·(1 + λ·c_max)`` over the runs of the round that started the
state (the challenger's largest weight, the largest final cost), fixed from then on. A DR
difference below it (a later run weighted more) is clipped up to it: the one way the
sequence can err towards the challenger, so ``clipped`` counts them in the evidence.

>>> ev = Evidence.start("champion-v1", "candidate-v2")
>>> ev.add(["r1", "r2"], [0.1, -0.05], floor=1.3)
2
>>> ev.add(["r2", "r3"], [-0.05, 0.2], floor=1.3)  # r2 is counted once
1
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import numpy as np

from stopserve.training.labels import FloatArray

__all__ = ["ALPHA", "TRUNCATION", "Evidence", "describe", "e_value", "log_capital", "lower_bound"]

#: The sequence's level: the one-round gate's 90% interval has its lower end at a one-sided 95%.
ALPHA: Final = 0.05
#: ``c``: the largest share of the capital bet on one run (WSR's ``trunc_scale``; below 1 so the
#: capital never falls to 0 on a run at the floor).
TRUNCATION: Final = 0.5
_BISECT: Final = 60


def _bets(x: FloatArray, alpha: float, floor: float) -> FloatArray:
    """Predictable plug-in empirical-Bernstein bets (each reads only the runs before it)."""
    t = np.arange(1, x.size + 1, dtype=np.float64)
    prior_var = floor * floor / 4.0  # the largest variance of a difference spread over [-floor, floor]
    mean = np.cumsum(x) / (t + 1.0)  # shrunk to 0 by one pseudo-run
    var = (prior_var + np.cumsum((x - mean) ** 2)) / (t + 1.0)
    before = np.concatenate([[prior_var], var[:-1]])
    return np.sqrt(2.0 * math.log(1.0 / alpha) / (before * t * np.log1p(t)))


def log_capital(
    x: Sequence[float] | FloatArray, m: float, *, floor: float, alpha: float = ALPHA
) -> FloatArray:
    """``log K_t(m)`` after each run: the bettor's log wealth against "the mean is at most ``m``"."""
    xs = np.asarray(x, dtype=np.float64)
    if xs.size == 0:
        return np.zeros(0)
    if m <= -floor:
        return np.zeros(xs.size)  # nothing is below the floor: no bet against it
    lam = np.minimum(_bets(xs, alpha, floor), TRUNCATION / (m + floor))
    return np.cumsum(np.log1p(lam * (xs - m)))


def e_value(x: Sequence[float] | FloatArray, *, floor: float, alpha: float = ALPHA) -> float:
    """``max_t K_t(0)``: the evidence against "the challenger is no better" (promote at ``1/α``)."""
    path = log_capital(x, 0.0, floor=floor, alpha=alpha)
    return float(math.exp(min(float(path.max()), 700.0))) if path.size else 1.0


def lower_bound(x: Sequence[float] | FloatArray, *, floor: float, alpha: float = ALPHA) -> float:
    """The (1 − ``alpha``) lower confidence sequence of the mean of ``x``, after it all (``-floor``: none)."""
    xs = np.asarray(x, dtype=np.float64)
    target = math.log(1.0 / alpha)

    def rejected(m: float) -> bool:
        path = log_capital(xs, m, floor=floor, alpha=alpha)
        return bool(path.size) and float(path.max()) >= target

    lo, hi = -floor, float(xs.max()) if xs.size else -floor
    if hi <= lo or not rejected(lo + 1e-12 * floor):
        return -floor
    for _ in range(_BISECT):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if rejected(mid) else (lo, mid)
    return lo


@dataclass
class Evidence:
    """The sequential evidence of one challenger against one champion (``sequential.json``).

    ``differences[i]`` is run ``run_ids[i]``'s paired DR difference, clipped at ``-floor``,
    in the order the runs were added (a round's in the order it judged them). ``floor`` is
    fixed by the first round that adds runs (None before).
    """

    champion: str | None
    candidate: str | None
    floor: float | None = None
    alpha: float = ALPHA
    run_ids: list[str] = field(default_factory=list)
    differences: list[float] = field(default_factory=list)
    rounds: int = 0
    clipped: int = 0

    @classmethod
    def start(cls, champion: str | None, candidate: str | None) -> Evidence:
        """No evidence yet about ``candidate`` against ``champion``."""
        return cls(champion, candidate)

    def matches(self, champion: str | None, candidate: str | None) -> bool:
        """This evidence is about ``candidate`` against ``champion`` (else it starts anew)."""
        return (self.champion, self.candidate) == (champion, candidate)

    def add(self, run_ids: Sequence[str], differences: Sequence[float] | FloatArray, *, floor: float) -> int:
        """Add one round's runs: those not counted before (by id); returns how many were added.

        ``floor``: the bound below the differences, kept from the first round that adds runs.
        """
        if self.floor is None:
            self.floor = float(floor)
        seen = set(self.run_ids)
        added = 0
        for rid, x in zip(run_ids, np.asarray(differences, dtype=np.float64).tolist(), strict=True):
            if rid in seen or not math.isfinite(x):
                continue
            seen.add(rid)
            self.run_ids.append(str(rid))
            self.clipped += x < -self.floor
            self.differences.append(max(x, -self.floor))
            added += 1
        self.rounds += added > 0
        return added

    @property
    def runs(self) -> int:
        """How many runs the evidence holds."""
        return len(self.run_ids)

    @property
    def e_value(self) -> float:
        """The evidence against "no better" (see :func:`e_value`; 1 before any run)."""
        if self.floor is None or not self.differences:
            return 1.0
        return e_value(self.differences, floor=self.floor, alpha=self.alpha)

    @property
    def capital(self) -> float:
        """``K_t(0)`` now, after the last run (the e-value is its largest so far; 1 before any run)."""
        if self.floor is None or not self.differences:
            return 1.0
        path = log_capital(self.differences, 0.0, floor=self.floor, alpha=self.alpha)
        return float(math.exp(min(float(path[-1]), 700.0)))

    @property
    def lower(self) -> float | None:
        """The lower end of the confidence sequence of the mean difference (see :func:`lower_bound`)."""
        if self.floor is None or not self.differences:
            return None
        return lower_bound(self.differences, floor=self.floor, alpha=self.alpha)

    @property
    def passed(self) -> bool:
        """The e-value reached ``1/alpha``: better than the champion, by the sequence."""
        return self.runs > 0 and self.e_value >= 1.0 / self.alpha

    def summary(self) -> dict[str, Any]:
        """What the evidence says (for the promotions log; no run ids)."""
        return {
            "champion": self.champion,
            "candidate": self.candidate,
            "rounds": self.rounds,
            "runs": self.runs,
            "mean": float(np.mean(self.differences)) if self.differences else None,
            "lower": self.lower,
            "e_value": self.e_value,
            "capital": self.capital,
            "needed": 1.0 / self.alpha,
            "alpha": self.alpha,
            "floor": self.floor,
            "clipped": self.clipped,
            "passed": self.passed,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (what the store keeps): every field."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evidence | None:
        """The evidence in ``data``; None when it is not evidence this version can read."""
        try:
            ids = [str(r) for r in data["run_ids"]]
            xs = [float(x) for x in data["differences"]]
            if len(ids) != len(xs):
                return None
            return cls(
                champion=data.get("champion"),
                candidate=data.get("candidate"),
                floor=None if data.get("floor") is None else float(data["floor"]),
                alpha=float(data.get("alpha", ALPHA)),
                run_ids=ids,
                differences=xs,
                rounds=int(data.get("rounds", 0)),
                clipped=int(data.get("clipped", 0)),
            )
        except (KeyError, TypeError, ValueError):
            return None


def describe(seq: Mapping[str, Any]) -> str:
    """Evidence's ``summary()`` (with ``added`` and ``supported``, as the gate gives it) in words."""
    if not seq["runs"]:
        return "no runs yet (this round's figures are not supported, whatever their number of runs)"
    if seq["added"]:
        added = ""
    elif seq["supported"]:
        added = " (none added this round: every run was counted before)"
    else:
        added = " (none added this round: its figures are not supported, whatever their number of runs)"
    level = 1 - seq["alpha"]
    rounds = f"{seq['rounds']} round{'' if seq['rounds'] == 1 else 's'}"
    return (
        f"{seq['runs']} held-out runs over {rounds}{added}, candidate − champion = {seq['mean']:+.4f} per "
        f"run, {level:.0%} confidence sequence's lower bound {seq['lower']:+.4f}, e-value "
        f"{seq['e_value']:.3g} ({seq['needed']:g} promotes)"
    )
