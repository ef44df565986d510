import subprocess
import sys

import pytest

import stopserve


def test_all_is_sorted_and_importable() -> None:
    names = stopserve.__all__
    assert list(names) == sorted(names), "keep stopserve.__all__ sorted"
    for name in names:
        assert hasattr(stopserve, name), name


def test_version_matches_metadata() -> None:
    from importlib.metadata import version

    assert stopserve.__version__ == version("stopserve")


#: Modules a client, a trainer or the hook imports: none may pull in the web server.
CORE = (
    "stopserve.api",
    "stopserve.client",
    "stopserve.error_table",
    "stopserve.errors",
    "stopserve.features",
    "stopserve.ids",
    "stopserve.policy",
    "stopserve.safety",
    "stopserve.service.engine",
    "stopserve.trace",
)


@pytest.mark.parametrize("module", CORE)
def test_core_never_imports_fastapi(module: str) -> None:
    # a fresh interpreter, so whatever it imports (directly or not) is in sys.modules
    code = (
        "import importlib, sys; importlib.import_module(sys.argv[1]); "
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'fastapi', 'starlette', 'uvicorn'}))"
    )
    out = subprocess.run([sys.executable, "-c", code, module], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"{module} imports {out.stdout.strip()}"


def test_the_import_check_sees_an_indirect_import() -> None:
    code = "import importlib, sys; importlib.import_module(sys.argv[1]); print('starlette' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code, "stopserve.service.errors"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "True"
