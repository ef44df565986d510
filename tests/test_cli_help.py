"""Help that is true and complete: every option of every command has a help text, and says
its default when it has one (a test walks every ``--help``)."""

from __future__ import annotations

import argparse

import pytest

from stopserve.cli import build_parser, main


def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((*prefix, name))
                found += commands(sub, (*prefix, name))
    return found


def parser_of(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


COMMANDS = commands(build_parser())


def entry(help_text: str, action: argparse.Action) -> str:
    """The lines of ``--help`` that describe one option or argument (flattened)."""
    lines = help_text.splitlines()
    first = action.option_strings[0] if action.option_strings else (action.metavar or action.dest)
    for i, line in enumerate(lines):
        if line.strip().startswith(str(first)):
            out = [line]
            for more in lines[i + 1 :]:
                if not more.startswith(" " * 4) or more.strip().startswith("-"):
                    break
                out.append(more)
            return " ".join(x.strip() for x in out)
    return ""


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_option_has_help_and_its_default(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = parser_of(path)
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    problems = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        if not action.help:
            problems.append(f"{name}: no help")
            continue
        shown = entry(text, action)
        unset = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        has_default = not unset and not action.required
        said = {str(action.default)} | (
            {f"{action.default:g}"} if isinstance(action.default, float) else set()
        )
        if has_default and not any(x in shown for x in said):
            problems.append(f"{name}: default {action.default!r} not said: {shown!r}")
        listed = action.choices is not None and not isinstance(action.choices, dict)
        if listed and not all(str(c) in text for c in action.choices or ()):
            problems.append(f"{name}: choices not all shown")
    assert not problems, f"stopserve {' '.join(path)} --help:\n" + "\n".join(problems)


def test_the_cli_lists_the_simulators_topologies() -> None:
    from stopserve.cli import SIM_TOPOLOGIES
    from stopserve.training.simulate.generate import DEFAULT_NOISE
    from stopserve.training.simulate.topology import SIM_TOPOLOGIES as REAL

    assert SIM_TOPOLOGIES == REAL
    assert f"default {DEFAULT_NOISE:g})" in parser_of(("simulate",)).format_help()


def test_the_help_says_what_is_true() -> None:
    serve = parser_of(("serve",)).format_help()
    assert "only 1 for now" not in serve and "STOPSERVE_STORE" in serve
    simulate = parser_of(("simulate",)).format_help()
    for topology in ("centralized", "debate", "swarm"):
        assert topology in simulate
    label = parser_of(("label",))
    assert "--mode" not in label.format_help()  # a label is no hook call: it has no mode
