"""``stopserve train`` with the never-worse-than-a-heuristic guard disarmed, for latency benchmarks.

    python bench/_force_model.py <stopserve train arguments>

The guard ships a tuned heuristic whenever the learned policy does not beat it in
cross-validated value; the latency benchmarks need the LightGBM path itself, so here
every heuristic is scored as "never stop" (the behavior policy) and the learned
boosters ship as long as they beat running to the end. The model is a real one (same
features, parameters, rounds and τ tuning as ``stopserve train``); only the guard's
comparison differs. Never use it for decisions: ``stopserve train`` is the product.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def main(argv: list[str]) -> int:
    import stopserve.training.fit as fit

    real = getattr(fit, "cross_fit_heuristics")  # noqa: B009 (not in fit's __all__)

    def never_stop(*args: Any, **kwargs: Any) -> Any:
        masks, params = real(*args, **kwargs)
        return {name: np.zeros_like(mask) for name, mask in masks.items()}, params

    setattr(fit, "cross_fit_heuristics", never_stop)  # noqa: B010
    from stopserve.cli import main as cli_main

    return cli_main(["train", *argv])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
