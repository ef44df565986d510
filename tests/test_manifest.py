"""The trainer → server contract: format 2 written, format 1 read, every served key typed."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from stopserve.artifacts import CARD_FILE, MANIFEST_FILE, load_model_dir, save_model_dir
from stopserve.errors import ModelIntegrityError
from stopserve.evidence import Evidence
from stopserve.manifest import MODEL_FORMAT, MODEL_FORMAT_V1, Gates, Manifest
from stopserve.objective import Objective
from stopserve.policy import Policy
from stopserve.safety import DEFAULT_SAFETY, SafetyConfig

SHIPPED = Path(__file__).resolve().parents[1] / "models" / "default"
#: the manifest the default model shipped with in format 1 (models/default at b4842f9, before
#: the 2026-12-04 retrain wrote format 2): what a model directory of that time holds
FORMAT_1 = Path(__file__).resolve().parent / "data" / "manifest_format1.json"
sys.path.insert(0, str(Path(__file__).parent / "decisions"))


def _v1() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FORMAT_1.read_text())
    assert data["format"] == MODEL_FORMAT_V1
    return data


def test_a_shipped_format_1_manifest_reads_as_one_name_per_setting() -> None:
    v1 = _v1()
    m = Manifest.from_data(v1)
    # min_turns was written three times and the cost share twice: each is one field now
    assert m.gates == Gates(
        veto_min_turns=v1["safety"]["min_turns"],
        model_min_turns=v1["min_turns"],
        reward_rule_min_turns=v1["rule"]["min_turns"],
    )
    assert m.objective == Objective(cost_share=v1["default_cost_share"], unit=v1["cost_unit"])
    assert m.cost_scale.kind == "per_run" and m.cost_unit == "ktokens"
    assert m.margins.stop == v1["margins"]["stop"] and m.margins.continue_at == math.inf
    assert (
        m.base_rule is not None
        and m.base_rule.name == v1["rule_name"]
        and m.base_rule.text == v1["rule_text"]
    )
    assert m.evidence == Evidence(**v1["evidence"]) and m.stop_on == "evidence" and m.proposals == "refuse"
    report = ("cv", "guard", "training_data", "feature_importance", "params", "notes")
    written = json.dumps({k: v for k, v in m.to_dict().items() if k not in report})
    assert written.count('"min_turns"') == 0 and written.count("cost_share") == 1
    for key in ("veto_min_turns", "model_min_turns", "reward_rule_min_turns"):
        assert written.count(key) == 1
    # format 2 reads back to the same manifest
    again = Manifest.from_data(m.to_dict())
    assert again == m and again.to_dict() == m.to_dict() and m.to_dict()["format"] == MODEL_FORMAT


def test_the_shipped_model_resaved_in_format_2_decides_as_it_did(tmp_path: Path) -> None:
    import record_decisions as record

    art = load_model_dir(SHIPPED)
    resaved = save_model_dir(tmp_path / "v2", art.manifest, art.models)
    assert json.loads((resaved / MANIFEST_FILE).read_text())["format"] == MODEL_FORMAT
    assert (resaved / CARD_FILE).read_text().startswith("# Model card: model-behavior")
    before = record.scenario_decisions(Policy.load(SHIPPED))
    after = record.scenario_decisions(Policy.load(resaved))
    assert after == before


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"margin": {"stop": 0.1}}, "margin: unknown field (did you mean 'margins'?)"),
        (
            {"gates": {"model_min_turn": 2}},
            "gates.model_min_turn: unknown field (did you mean 'model_min_turns'?)",
        ),
        ({"margins": {"stop": "high"}}, "margins.stop"),
        ({"gates": {"veto_min_turns": -1}}, "gates.veto_min_turns"),
        ({"objective": {"lambda": 0.1, "cost_share": 0.3}}, "not both"),
        ({"overrules": ["loops"]}, "overrules[0]"),
        ({"stop_on": "evidense"}, "stop_on"),
        ({"models": {"g": {"transform": "sigmoyd"}}}, "models.g.transform"),
        ({"cost_scale": {"kind": "fixed"}}, "mean_behavior_cost"),
        ({"safety": {"min_turns": 2}}, "safety.min_turns: format /2 holds it once, as gates.veto_min_turns"),
        ({"evidence": {"repeat": -1}}, "evidence"),
    ],
)
def test_a_mistyped_or_bad_key_is_an_error_naming_it(change: dict[str, Any], where: str) -> None:
    data = {"format": MODEL_FORMAT, "kind": "none", **change}
    with pytest.raises(ModelIntegrityError) as caught:
        Manifest.from_data(data, source="m/manifest.json")
    text = str(caught.value)
    assert where in text and "m/manifest.json: " in text, text


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"margin": {"stop": 0.1}}, "margin: unknown field (did you mean 'margins'?)"),
        ({"min_turns": "high"}, "min_turns"),
        ({"default_lambda": -1}, "default_lambda"),
        ({"cost_unit": "tokens"}, "cost_unit"),
        ({"models": {"g": {"transform": "logit"}}}, "models.g.transform"),
    ],
)
def test_format_1_typos_are_errors_too(change: dict[str, Any], where: str) -> None:
    data = {**_v1(), **change}
    with pytest.raises(ModelIntegrityError, match=r"manifest\.json") as caught:
        Manifest.from_data(data)
    assert where in str(caught.value), str(caught.value)


def test_format_1_without_overrules_could_only_add_to_the_default_nets() -> None:
    old = {"format": MODEL_FORMAT_V1, "kind": "heuristic", "method": "heuristic", "safety": {"loop": False}}
    m = Manifest.from_data(old)
    assert m.overrules == ("proposed", "rule")
    nets = m.nets()
    assert nets.loop.enabled or any(child.loop.enabled for child in nets.any or ())  # the default loop stays
    # a format-2 manifest states its whole config: its rules as tuned, budgets never looser
    new = Manifest(kind="heuristic", method="heuristic", safety=SafetyConfig(loop=None, max_turns=10**6))
    assert not new.nets().loop.enabled and new.nets().max_turns == DEFAULT_SAFETY.max_turns


def test_format_1_optimal_objectives_must_agree() -> None:
    base = {
        "format": MODEL_FORMAT_V1,
        "kind": "heuristic",
        "method": "optimal",
        "cost_scale": {"kind": "fixed", "mean_behavior_cost": 10.0},
        "default_cost_share": 0.3,
        "default_lambda": 0.03,
    }
    # lambda 0.03 is the share 0.3 of a mean run costing 10: the same weight, read as one objective
    m = Manifest.from_data({**base, "objective": {"lambda": 0.3 / 10.0, "cost_share": None}})
    assert m.objective == Objective(cost_share=0.3, unit="ktokens")
    with pytest.raises(ModelIntegrityError, match="objective"):
        Manifest.from_data({**base, "objective": {"lambda": 0.5, "cost_share": None}})


def test_the_gates_and_their_configs_are_one_setting() -> None:
    with pytest.raises(Exception, match="veto_min_turns"):
        Manifest(kind="none", safety=SafetyConfig(min_turns=3), gates=Gates(veto_min_turns=1))
    m = Manifest(kind="none", safety=SafetyConfig(min_turns=3), gates=Gates(veto_min_turns=3))
    assert m.to_dict()["gates"]["veto_min_turns"] == 3 and "min_turns" not in m.to_dict()["safety"]
    assert Manifest.from_data(m.to_dict()).safety == SafetyConfig(min_turns=3)


def test_report_sections_are_loose_and_no_decision_reads_them() -> None:
    shipped: dict[str, Any] = json.loads((SHIPPED / MANIFEST_FILE).read_text())
    m = Manifest.from_data(shipped)
    odd = Manifest.from_data({**shipped, "cv": {"anything": [1, 2]}, "guard": {"x": None}, "notes": ["n"]})
    models = load_model_dir(SHIPPED).models
    a, b = Policy.from_manifest(m, models), Policy.from_manifest(odd, models)
    assert (a.deviation, a.objective, a.safety, a.rule) == (b.deviation, b.objective, b.safety, b.rule)
