import importlib

import stopserve


def test_all_is_sorted_and_importable() -> None:
    names = stopserve.__all__
    assert list(names) == sorted(names), "keep stopserve.__all__ sorted"
    for name in names:
        assert hasattr(stopserve, name), name


def test_version_matches_metadata() -> None:
    from importlib.metadata import version

    assert stopserve.__version__ == version("stopserve")


def test_core_never_imports_fastapi() -> None:
    for module in ("stopserve.trace", "stopserve.errors"):
        mod = importlib.import_module(module)
        assert "fastapi" not in vars(mod)
