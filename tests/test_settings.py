"""Settings: STOPSERVE_ variables, explicit overrides, and located errors."""

from __future__ import annotations

import pytest

from stopserve.errors import ConfigError
from stopserve.settings import Settings, load_settings


def test_environment_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOPSERVE_PORT", "9123")
    monkeypatch.setenv("STOPSERVE_ACCESS_LOG", "true")
    settings = load_settings()
    assert settings.port == 9123
    assert settings.access_log is True


def test_defaults_keep_the_access_log_off() -> None:
    assert Settings().access_log is False


def test_overrides_win_and_none_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOPSERVE_PORT", "9123")
    assert load_settings(port=9555).port == 9555
    assert load_settings(port=None).port == 9123


def test_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOPSERVE_PORT", "eighty")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert any(issue.path == "STOPSERVE_PORT" for issue in info.value.issues)


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("STOPSERVE_SAFETY", '{"max_turns": 40,}', "trailing comma is not allowed: line 1 column 17"),
        ("STOPSERVE_CORS_ORIGINS", '["https://a.example",', "line 1 column"),
    ],
)
def test_a_structured_variable_that_is_not_json_says_so_and_where(
    monkeypatch: pytest.MonkeyPatch, name: str, text: str, said: str
) -> None:
    monkeypatch.setenv(name, text)
    with pytest.raises(ConfigError) as err:
        load_settings()
    (issue,) = err.value.issues
    assert issue.path == name and issue.message.startswith("not valid JSON: ") and said in issue.message
    assert "valid dictionary" not in str(err.value)
