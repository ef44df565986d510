"""The Dockerfile's install steps in a clean virtual environment, then the server started from it.

Slow (a fresh ``pip install`` of every runtime dependency: minutes on first run), so
marked ``slow``: ``python -m pytest -m slow tests/service/test_service_install.py``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from servers import LiveServer

ROOT = Path(__file__).resolve().parents[2]


def dockerfile_steps() -> tuple[list[tuple[str, str]], list[str]]:
    """The COPY (source, destination) pairs and RUN commands of the Dockerfile, in order."""
    copies: list[tuple[str, str]] = []
    runs: list[str] = []
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        words = line.strip().split(None, 1)
        if len(words) < 2:
            continue
        if words[0] == "COPY":
            *sources, dest = shlex.split(words[1])
            copies += [(src, dest) for src in sources]
        elif words[0] == "RUN":
            runs.append(words[1])
    return copies, runs


def dockerfile_commands() -> list[str]:
    """Every command of every RUN step (split on ``&&``), in order."""
    _, runs = dockerfile_steps()
    return [c.strip() for run in runs for c in run.split("&&")]


def dockerfile_pip_target() -> str:
    """What the Dockerfile's one ``pip install`` installs (the project and its extras)."""
    pip = [c for c in dockerfile_commands() if c.startswith("python -m pip install ")]
    assert len(pip) == 1, pip
    args = shlex.split(pip[0])[4:]
    assert len(args) == 1 and "--no-deps" not in args, args  # dependencies resolved by pip
    return args[0]


def test_dockerfile_steps_are_what_this_test_runs() -> None:
    copies, _ = dockerfile_steps()
    assert ("stopserve", "./stopserve") in copies and ("models/default", "./models/default") in copies
    assert dockerfile_pip_target() == ".[redis,fast]"  # what the venv test installs
    # besides pip: system packages (libgomp1; gcc, removed in its own step), the default model's
    # compiled cache (python -c), the service's user and its log folder
    kinds = {c.split()[0] for c in dockerfile_commands() if not c.startswith("python -m pip install ")}
    assert kinds <= {"apt-get", "python", "rm", "useradd", "mkdir", "chown"}, kinds
    builds = [c for c in dockerfile_commands() if c.startswith("python -c ")]
    assert len(builds) <= 1 and all("Policy.load" in c for c in builds)


@pytest.mark.slow
def test_clean_venv_install_serves(tmp_path: Path) -> None:
    copies, _ = dockerfile_steps()
    app = tmp_path / "app"
    app.mkdir()
    for src, dest in copies:
        # Docker's rule: a destination ending in "/" is a folder the source goes into
        target = app / dest / Path(src).name if dest.endswith("/") else app / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / src).is_dir():
            shutil.copytree(ROOT / src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / src, target)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # the Dockerfile's RUN: the project with its `fast` extra, dependencies resolved by pip
    target = dockerfile_pip_target()
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", target],
        cwd=app,
        check=False,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # nothing from the dev or train extras came along: the image holds what serving needs
    for module in ("schemathesis", "tqdm", "sklearn", "matplotlib"):
        check = subprocess.run([str(python), "-c", f"import {module}"], check=False, capture_output=True)
        assert check.returncode != 0, f"{module} is installed without extras"
    store = subprocess.run([str(python), "-c", "import redis, msgpack"], check=False, capture_output=True)
    assert store.returncode == 0, store.stderr  # STOPSERVE_STORE=redis://... works in the image
    installed_model = subprocess.run(
        [str(python), "-c", "from stopserve.settings import default_model_dir; print(default_model_dir())"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    ).stdout.strip()
    expect_model = (ROOT / "models" / "default" / "manifest.json").exists()
    assert (installed_model != "None") == expect_model, installed_model
    # the Dockerfile's build step: the default model's libraries into the image's cache
    cache = {"STOPSERVE_CACHE_DIR": str(tmp_path / "cache")}
    builds = [c for c in dockerfile_commands() if c.startswith("python -c ")]
    compiled = expect_model and bool(builds) and target == ".[fast]" and shutil.which("gcc") is not None
    if compiled:
        code = shlex.split(builds[0])[2]
        subprocess.run([str(python), "-c", code], cwd=tmp_path, env={**os.environ, **cache}, check=True)
    server = LiveServer(
        log_dir=tmp_path / "logs", command=[str(venv / "bin" / "stopserve")], startup_timeout=120, env=cache
    )
    with server:
        model = httpx.get(server.url + "/v1/model").json()
        assert model["safety_only"] is (not expect_model)
        if compiled:  # served from the cache the build step wrote
            assert model["manifest"]["inference"]["engine"] == "tl2cgen"
            assert model["manifest"]["inference"]["cache"] in ("hit", "reused")
        r = httpx.post(
            server.url + "/v1/runs/venv/decide",
            json={"events": [{"id": "a", "t": 0, "type": "return", "agent": "x"}]},
        )
        assert r.status_code == 200 and r.json()["action"] in ("continue", "stop")
