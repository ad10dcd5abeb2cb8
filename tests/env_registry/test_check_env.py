"""`env_registry.check_env`: the conformance checks of an env given by ID, by spec or by factory, and the
report's `assert_passed` that makes an env package's test one line."""

from __future__ import annotations

import pytest

import env_registry
from env_registry import check_env
from molt_envs.envs.gsm8k import GSM8KEnv


def test_an_id_is_resolved_and_checked_with_its_own_data():
    report = check_env("molt/gsm8k-v1").assert_passed()
    assert report.subject.startswith("molt/gsm8k-v1 (molt-ecosystem ")
    assert sum(c.name.endswith("reference action") for c in report.checks) == 3


def test_a_spec_is_checked_as_given_and_a_failure_raises_with_the_report():
    spec = env_registry.spec("molt/gsm8k-v1").model_copy(update={"reward_range": (0.0, 0.5)})
    report = check_env(spec)
    assert not report.passed
    with pytest.raises(AssertionError) as info:
        report.assert_passed()
    assert str(info.value) == report.render()
    assert "reward 1.0 outside the declared reward_range [0.0, 0.5]" in str(info.value)


def test_a_factory_is_checked_against_rows():
    rows = env_registry.load_split(env_registry.spec("molt/gsm8k-v1"), "test", 2)
    report = check_env(GSM8KEnv, rows, reward_range=(0.0, 1.0), deterministic=True).assert_passed()
    assert report.subject == "GSM8KEnv" and len(report.checks) == 3 + 2 * 3


def test_an_unknown_id_fails_the_report_and_bad_calls_raise():
    report = check_env("molt/gsm8k-v9")
    assert [(c.name, c.passed) for c in report.checks] == [("resolve id", False)]
    with pytest.raises(AssertionError, match="version v9 of 'molt/gsm8k' does not exist"):
        report.assert_passed()
    with pytest.raises(TypeError, match="brings its own rows"):
        check_env("molt/gsm8k-v1", reward_range=(0.0, 2.0))
    with pytest.raises(TypeError, match="needs dataset rows"):
        check_env(GSM8KEnv)
