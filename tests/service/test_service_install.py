"""The Dockerfile's install steps in a clean virtual environment, then the server started from it.

Slow (a fresh ``pip install`` of every runtime dependency: minutes on first run), so
marked ``slow``: ``python -m pytest -m slow tests/service/test_service_install.py``.
"""

from __future__ import annotations

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


def test_dockerfile_steps_are_what_this_test_runs() -> None:
    copies, runs = dockerfile_steps()
    assert ("stopserve", "./stopserve") in copies and ("models/default", "./models/default") in copies
    pip = [r for r in runs if r.startswith("python -m pip install ")]
    assert len(pip) == 1 and pip[0].startswith("python -m pip install . ")  # what the venv test runs
    assert "--no-deps" not in pip[0]
    # the only other step installs system libraries (libgomp1), present on the test machine
    assert all(r.startswith("apt-get update") for r in runs if r not in pip)


@pytest.mark.slow
def test_clean_venv_install_without_extras_serves(tmp_path: Path) -> None:
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
    # the Dockerfile's RUN: the project WITHOUT extras, dependencies resolved by pip
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "."],
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
    installed_model = subprocess.run(
        [str(python), "-c", "from stopserve.settings import default_model_dir; print(default_model_dir())"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    ).stdout.strip()
    expect_model = (ROOT / "models" / "default" / "manifest.json").exists()
    assert (installed_model != "None") == expect_model, installed_model
    server = LiveServer(
        log_dir=tmp_path / "logs", command=[str(venv / "bin" / "stopserve")], startup_timeout=120
    )
    with server:
        model = httpx.get(server.url + "/v1/model").json()
        assert model["safety_only"] is (not expect_model)
        r = httpx.post(
            server.url + "/v1/runs/venv/decide",
            json={"events": [{"id": "a", "t": 0, "type": "return", "agent": "x"}]},
        )
        assert r.status_code == 200 and r.json()["action"] in ("continue", "stop")
