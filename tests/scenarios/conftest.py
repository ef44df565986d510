"""One REAL server serving the shipped default model as a fresh clone does (no --model, no
settings), and a URL nobody listens on (the service down)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from scenario_runs import Service
from servers import LiveServer, free_port

from stopserve.settings import default_model_dir


@pytest.fixture(scope="package")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """``stopserve serve`` with nothing but a port and a log dir: what a new user runs."""
    shipped = default_model_dir()
    assert shipped is not None, "no shipped default model (models/default/manifest.json) to serve"
    with LiveServer(log_dir=tmp_path_factory.mktemp("scenarios-log")) as srv:
        info = httpx.get(srv.url + "/v1/model", timeout=10.0).json()
        # the scenarios are about the default model: make sure that is what answers
        assert info["kind"] == "model" and info["path"] == str(shipped), info
        yield srv


@pytest.fixture
def down_url() -> str:
    """A loopback port nothing listens on: the sidecar is down."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(params=["up", "down"])
def service(request: pytest.FixtureRequest) -> Service:
    """The default server (``up``), or a URL nobody listens on (``down``)."""
    if request.param == "up":
        server: LiveServer = request.getfixturevalue("default_server")
        return Service(server.url, down=False)
    return Service(str(request.getfixturevalue("down_url")), down=True)
