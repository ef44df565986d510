"""One real stopserve server (no model: safety nets decide) shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from servers import LiveServer


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(log_dir=tmp_path_factory.mktemp("integrations-log"), no_model=True) as srv:
        yield srv
