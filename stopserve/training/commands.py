"""Command bodies that choose where the work runs: in this process, or on a Dask cluster.

Here, not beside the work, so the arrows run one way: ``stopserve.training.distributed``
builds on ``labels`` and ``backend``, and neither of those imports it.
"""

from __future__ import annotations

import argparse

from stopserve.training.labels import load_decision_points, write_features_csv

__all__ = ["features_command"]


def features_command(args: argparse.Namespace) -> int:
    """``stopserve features TRACES (-o CSV | --parquet DIR) [--dask ADDRESS|local:N]``."""
    if args.parquet is not None or args.dask is not None:
        from stopserve.training.distributed import features_dask_command

        return features_dask_command(args)
    dp = load_decision_points(
        args.traces,
        cost_unit=args.cost_unit,
        labels_from_rewards=args.labels_from_rewards,
        progress=not args.no_progress,
    )
    write_features_csv(dp, args.output)
    return 0
