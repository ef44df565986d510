"""A missing extra is one line naming it, exit 2, from every command that needs one."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from stopserve.extras import EXTRAS, MissingExtraError, require

ROOT = Path(__file__).resolve().parents[1]
HIDE = Path(__file__).parent / "hide_modules.py"
RUNS = ROOT / "examples" / "mint-sample"


def run_without(hidden: str, *args: str, env: dict[str, str] | None = None, cwd: Path) -> tuple[int, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STOPSERVE_")}
    environ.update(env or {})
    proc = subprocess.run(
        [sys.executable, str(HIDE), hidden, *args],
        check=False,
        env=environ,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stopserve.cli import main

    out = tmp_path_factory.mktemp("extras") / "runs.jsonl"
    assert main(["import", "mint", str(RUNS), "-o", str(out), "--no-progress"]) == 0
    return out


CASES = [
    ("redis", "redis", ["serve", "--no-model", "--port", "9"], {"STOPSERVE_STORE": "redis://127.0.0.1:9/0"}),
    (
        "msgpack",
        "redis",
        ["serve", "--no-model", "--port", "9"],
        {"STOPSERVE_STORE": "redis://127.0.0.1:9/0"},
    ),
    ("distributed", "dask", ["train", "{traces}", "-o", "m", "--dask", "local:1"], None),
    ("pyarrow", "dask", ["features", "{traces}", "--parquet", "pq"], None),
    ("matplotlib", "plot", ["credit", "{traces}", "--plot", "credit.png"], None),
    ("tqdm", "train", ["train", "{traces}", "-o", "m"], None),
]


@pytest.mark.parametrize(("hidden", "extra", "args", "env"), CASES, ids=[c[0] for c in CASES])
def test_a_missing_extra_is_one_line_and_exit_2(
    hidden: str, extra: str, args: list[str], env: dict[str, str] | None, traces: Path, tmp_path: Path
) -> None:
    rc, out = run_without(hidden, *(a.format(traces=traces) for a in args), env=env, cwd=tmp_path)
    lines = out.strip().splitlines()
    assert rc == 2, out
    assert len(lines) == 1 and "Traceback" not in out, out
    assert f"needs the [{extra}] extra ({hidden}" in lines[0]
    assert f"pip install -e '.[{extra}]'" in lines[0]


def test_require_names_the_extra_and_the_module() -> None:
    with pytest.raises(MissingExtraError) as err:
        require("plot", "json", "no_such_module_here", what="--plot")
    assert (err.value.extra, err.value.module) == ("plot", "no_such_module_here")
    assert str(err.value).startswith("--plot needs the [plot] extra (no_such_module_here is not installed)")


def test_every_extra_is_in_pyproject() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) == set(extras) - {"dev", "all", "bench"}


def test_a_compiled_engine_asked_for_without_the_fast_extra_is_one_line(tmp_path: Path) -> None:
    env = {"STOPSERVE_INFERENCE": "tl2cgen", "STOPSERVE_CACHE_DIR": str(tmp_path / "cache")}
    rc, out = run_without("tl2cgen,treelite", "serve", "--port", "9", env=env, cwd=tmp_path)
    assert rc == 2 and len(out.strip().splitlines()) == 1 and "Traceback" not in out, out
    assert "tl2cgen is not installed" in out and "pip install -e '.[fast]'" in out
    # without asking for it, the service serves with LightGBM's predict and says why (tests/test_inference.py)
