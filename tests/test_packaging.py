"""What the wheel installs: the ``stopserve`` package only (with the default model), and the
runtime dependencies a sidecar needs, nothing training or the tests need."""

from __future__ import annotations

import email
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    pytest.importorskip("hatchling", reason="the build backend (in the dev extra) builds the wheel here")
    out = tmp_path_factory.mktemp("wheel")
    build = ["wheel", ".", "-w", str(out), "-q", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", *build],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (path,) = out.glob("stopserve-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_installs_only_the_stopserve_package(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"stopserve"}  # no top-level `training`
    names = set(wheel.namelist())
    for file in ("manifest.json", "MODEL_CARD.md"):
        assert f"stopserve/_default_model/{file}" in names
    assert "stopserve/training/simulate/__init__.py" in names


def test_the_runtime_needs_no_training_or_test_libraries(wheel: zipfile.ZipFile) -> None:
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    message = email.message_from_bytes(wheel.read(meta))
    runtime = {
        req.split(";")[0].split("[")[0].split("<")[0].split(">")[0].strip().lower()
        for req in message.get_all("Requires-Dist") or []
        if "extra ==" not in req
    }
    assert {"fastapi", "uvicorn", "lightgbm", "numpy", "pydantic", "httpx"} <= runtime
    assert not runtime & {"scikit-learn", "tqdm", "matplotlib", "opentelemetry-sdk", "pytest"}
    assert "train" in (message.get_all("Provides-Extra") or [])
