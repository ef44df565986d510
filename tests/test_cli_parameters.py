"""The command line stays in ``stopserve/cli``, and the trainer's options are its parameter table.

Issue 35 item 4: no module outside ``stopserve/cli`` imports argparse; every entry of
``TRAINER_PARAMETERS`` is an option of ``train`` and ``retrain`` with the table's
default, and the values the parser gives build a checked ``TrainerSettings``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest

from stopserve.cli import build_parser
from stopserve.cli.train import trainer_settings
from stopserve.errors import TrainingError
from stopserve.training.fit import PolicyLearner
from stopserve.training.parameters import TRAINER_PARAMETERS, TrainerSettings

PACKAGE = Path(__file__).resolve().parents[1] / "stopserve"


def _imports_argparse(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "argparse" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "argparse":
            return True
    return False


def test_only_the_cli_package_imports_argparse() -> None:
    cli = PACKAGE / "cli"
    offenders = [
        str(path.relative_to(PACKAGE.parent))
        for path in sorted(PACKAGE.rglob("*.py"))
        if cli not in path.parents and _imports_argparse(path)
    ]
    assert not offenders, f"argparse outside stopserve/cli: {offenders}"
    assert _imports_argparse(cli / "__init__.py")  # the scan does find an import


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices[name]
    return found


@pytest.mark.parametrize("command", ["train", "retrain"])
def test_every_table_entry_is_an_option_with_its_default(command: str) -> None:
    options = {a.dest: a for a in _subparser(command)._actions}
    for param in TRAINER_PARAMETERS:
        action = options.get(param.name)
        assert action is not None, f"{command}: no option for {param.name}"
        assert param.flag in action.option_strings, (param.flag, action.option_strings)
        assert action.default == param.default, (param.name, action.default, param.default)
        assert action.help == param.help.replace("%", "%%")
        if param.constraint is not None and hasattr(param.constraint, "options"):
            assert tuple(action.choices or ()) == param.constraint.options


def test_the_settings_fields_are_the_table() -> None:
    names = [f.name for f in dataclasses.fields(TrainerSettings)]
    assert names == [p.name for p in TRAINER_PARAMETERS]
    defaults = TrainerSettings()
    for param in TRAINER_PARAMETERS:
        assert getattr(defaults, param.name) == param.default


def test_parsed_defaults_are_the_settings_defaults_and_the_learners() -> None:
    args = build_parser().parse_args(["train", "t.jsonl", "-o", "model"])
    assert trainer_settings(args) == TrainerSettings()
    # the estimator's own defaults are the table's too
    plain = PolicyLearner()
    learner = PolicyLearner.from_settings(TrainerSettings())
    for name in ("objective", "cost_scale", "method", "min_turns", "features", "folds", "seed", "min_groups"):
        assert getattr(learner, name) == getattr(plain, name), name
    for name in ("fixed_rules", "stop_on", "censored", "evidence", "floors", "inner_cv"):
        assert getattr(learner, name) == getattr(plain, name), name


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"folds": 0}, "folds must be a whole number >= 1, got 0"),
        ({"method": "best"}, "method must be auto, behavior or optimal, got 'best'"),
        ({"min_turns": 0}, "min_turns must be a whole number >= 1 or auto, got 0"),
        ({"cost_share": 101.0}, "cost_share must be a number >= 0 and <= 100, got 101.0"),
        ({"inner_cv": "yes"}, "inner_cv must be True or False, got 'yes'"),
        ({"lam": 1.0, "cost_share": 0.3}, "give lam or cost_share, not both"),
    ],
)
def test_the_library_says_what_is_wrong_in_its_own_words(given: dict[str, object], message: str) -> None:
    with pytest.raises(TrainingError) as err:
        TrainerSettings(**given)  # type: ignore[arg-type]
    assert str(err.value) == message
    assert "--" not in str(err.value)


def test_strict_floor_reaches_the_learners_floors() -> None:
    loose = PolicyLearner.from_settings(
        trainer_settings(build_parser().parse_args(["train", "t.jsonl", "-o", "m"]))
    )
    args = build_parser().parse_args(["train", "t.jsonl", "-o", "m", "--strict-floor"])
    strict = PolicyLearner.from_settings(trainer_settings(args))
    assert loose.floors is not None and loose.floors.paid
    assert strict.floors is not None and not strict.floors.paid
    assert strict.floors.success == loose.floors.success
