"""Issue 13, item 7: /v1/model serves only hashed files of the model directory; reload errors are 4xx."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from stopserve.service.app import create_app
from stopserve.settings import Settings

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def client(tmp_path: Path, model_dir: Path) -> TestClient:
    app = create_app(Settings(model_dir=model_dir, log_dir=tmp_path / "logs", admin_token=TOKEN))
    return TestClient(app, raise_server_exceptions=False)


def rewrite_manifest(model: Path, **changes: Any) -> None:
    path = model / "manifest.json"
    manifest = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    path.write_text(json.dumps(manifest))


def test_an_unlisted_model_card_is_never_read(tmp_path: Path, model_dir: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:SECRET")
    evil = tmp_path / "evil"
    shutil.copytree(model_dir, evil)
    manifest = json.loads((evil / "manifest.json").read_text())
    del manifest["files"]["MODEL_CARD.md"]
    (evil / "manifest.json").write_text(json.dumps(manifest))
    (evil / "MODEL_CARD.md").unlink()
    (evil / "MODEL_CARD.md").symlink_to(secret)
    with client(tmp_path, model_dir) as c:
        r = c.post("/v1/admin/reload", json={"model_dir": str(evil)}, headers=AUTH)
        assert r.status_code == 200, r.text
        info = c.get("/v1/model").json()
        assert "SECRET" not in json.dumps(info) and info["model_card"] is None


def test_a_listed_file_that_links_out_of_the_directory_is_refused(tmp_path: Path, model_dir: Path) -> None:
    evil = tmp_path / "evil"
    shutil.copytree(model_dir, evil)
    outside = tmp_path / "outside.md"
    shutil.copy(evil / "MODEL_CARD.md", outside)  # same bytes: the sha256 matches
    (evil / "MODEL_CARD.md").unlink()
    (evil / "MODEL_CARD.md").symlink_to(outside)
    with client(tmp_path, model_dir) as c:
        r = c.post("/v1/admin/reload", json={"model_dir": str(evil)}, headers=AUTH)
        assert r.status_code == 422, r.text
        assert "MODEL_CARD.md" in r.json()["error"]["message"] and "outside" in r.json()["error"]["message"]
        assert c.get("/v1/model").json()["model_version"] == "tiny-stop"
    # the card served is the one hashed in the manifest
    with client(tmp_path, model_dir) as c:
        assert c.get("/v1/model").json()["model_card"] == (model_dir / "MODEL_CARD.md").read_text()


@pytest.mark.parametrize(
    "changes",
    [
        {"default_lambda": "abc"},
        {"feature_names": 5},
        {"models": []},
        {"models": {"q": "q.txt"}},
        {"margins": 5},
        {"margins": {"stop": "x"}},
        {"objective": {"lambda": "x"}},
        {"cost_scale": {"mean_behavior_cost": [1]}},
        {"safety": 5},
        {"model_version": ["x"]},
        {"model_version": "v" * 300},
        {"files": []},
        {"files": {"q.txt": 5}},
        {"min_turns": "high"},
        {"default_cost_share": -1},
        {"rule": {"max_turn": 3}},
        {"base_rule": {"config": {"max_turn": 3}}},
        {"gates": {"veto_min_turns": "x"}},
        {"gates": {"model_min_turn": 2}},
        {"objective": {"cost_share": -1}},
        {"margin": {"stop": 0.1}},
    ],
)
def test_a_malformed_manifest_value_is_a_422_on_reload(
    tmp_path: Path, model_dir: Path, changes: dict[str, Any]
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad)
    rewrite_manifest(bad, **changes)
    with client(tmp_path, model_dir) as c:
        r = c.post("/v1/admin/reload", json={"model_dir": str(bad)}, headers=AUTH)
        assert r.status_code == 422, (changes, r.status_code, r.text)
        assert "manifest" in r.json()["error"]["message"]
        assert c.get("/v1/model").json()["model_version"] == "tiny-stop"


def test_the_token_is_checked_before_the_reload_body(tmp_path: Path, model_dir: Path) -> None:
    with client(tmp_path, model_dir) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            for body in (b"{not json", b'{"model_dir": 5}', b'{"surprise": 1}'):
                r = c.post(
                    "/v1/admin/reload", content=body, headers={**headers, "content-type": "application/json"}
                )
                assert r.status_code == 401, (headers, body, r.text)
        r = c.post(
            "/v1/admin/reload", content=b"{not json", headers={**AUTH, "content-type": "application/json"}
        )
        assert r.status_code == 422 and r.json()["error"]["issues"][0]["field"].startswith("body")
        r = c.post("/v1/admin/reload", headers=AUTH)  # no body: the configured directory
        assert r.status_code == 200, r.text
