"""Gymnasium's ID grammar and version rules, every error type, and the package pin."""

from __future__ import annotations

import warnings

import pytest

import env_registry
from env_registry import (
    DeprecatedEnv,
    DeprecatedEnvWarning,
    InvalidEnvId,
    NameNotFound,
    NamespaceNotFound,
    PackageVersionMismatch,
    RegistrationError,
    VersionNotFound,
    parse_env_id,
)
from env_registry.registry import Registry

EP = "molt_envs.envs.arith:ArithEnv"


@pytest.fixture
def reg() -> Registry:
    reg = Registry()
    reg.register("acme/echo-v1", EP)
    reg.register("acme/echo-v3", EP)
    reg.register("acme/plain", EP)
    reg.register("solo-v2", EP)
    return reg


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("acme/echo-v1", ("acme", "echo", 1, None)),
        ("echo", (None, "echo", None, None)),
        ("acme/echo", ("acme", "echo", None, None)),
        ("acme/echo-v12@1.4.2", ("acme", "echo", 12, "1.4.2")),
        ("a-b/c.d-e-v0", ("a-b", "c.d-e", 0, None)),
    ],
)
def test_parse(text, parts):
    parsed = parse_env_id(text)
    assert (parsed.namespace, parsed.name, parsed.version, parsed.pin) == parts
    assert str(parsed) == text


@pytest.mark.parametrize(
    "bad",
    ["", "../etc/passwd-v1", "acme//echo", "a/b/c", "echo v1", "x" * 200, "ac me/x", "/echo", "echo@", "echo@../1"],
)
def test_invalid_ids_name_the_value(bad):
    with pytest.raises(InvalidEnvId, match="not a valid env ID"):
        parse_env_id(bad)


def test_exact_match(reg):
    assert reg.spec("acme/echo-v3").id == "acme/echo-v3"
    assert reg.spec("acme/plain").id == "acme/plain"


def test_unversioned_resolves_to_latest_with_a_warning(reg):
    with pytest.warns(DeprecatedEnvWarning, match="latest version 'acme/echo-v3'"):
        assert reg.spec("acme/echo").id == "acme/echo-v3"


def test_registered_older_version_works_with_a_deprecation_warning(reg):
    with pytest.warns(DeprecatedEnvWarning, match="out of date; consider acme/echo-v3"):
        assert reg.spec("acme/echo-v1").id == "acme/echo-v1"


def test_latest_version_does_not_warn(reg):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reg.spec("acme/echo-v3")


def test_missing_version_above_latest_is_version_not_found(reg):
    with pytest.raises(VersionNotFound, match="v4 of 'acme/echo' does not exist; available: v1, v3"):
        reg.spec("acme/echo-v4")


def test_missing_version_below_latest_is_deprecated(reg):
    with pytest.raises(DeprecatedEnv, match="use 'acme/echo-v3'"):
        reg.spec("acme/echo-v2")
    with pytest.raises(DeprecatedEnv):
        reg.spec("solo-v1")


def test_version_of_an_unversioned_env_is_deprecated(reg):
    with pytest.raises(DeprecatedEnv, match="registered without a version"):
        reg.spec("acme/plain-v1")


def test_unknown_namespace_and_name_suggest(reg):
    with pytest.raises(NamespaceNotFound, match="Did you mean 'acme'"):
        reg.spec("acmee/echo-v1")
    with pytest.raises(NameNotFound, match="Did you mean 'echo'"):
        reg.spec("acme/ecko-v1")
    with pytest.raises(NameNotFound):
        reg.spec("nowhere-v1")


def test_versioned_and_unversioned_cannot_coexist(reg):
    with pytest.raises(RegistrationError, match="both an unversioned and a versioned ID"):
        reg.register("acme/plain-v1", EP)
    with pytest.raises(RegistrationError, match="both an unversioned and a versioned ID"):
        reg.register("acme/echo", EP)


def test_reregistering_overrides_with_a_warning(reg):
    with pytest.warns(UserWarning, match="overriding the registration of 'acme/echo-v3'"):
        reg.register("acme/echo-v3", "molt_envs.envs.gsm8k:GSM8KEnv")
    assert reg.spec("acme/echo-v3").entry_point == "molt_envs.envs.gsm8k:GSM8KEnv"


def test_bad_registration_fields_are_refused(reg):
    with pytest.raises(RegistrationError, match="entry_point"):
        reg.register("acme/x-v1", "not an entry point")
    with pytest.raises(RegistrationError, match="package pin"):
        reg.register("acme/x-v1@1.0", EP)
    with pytest.raises(RegistrationError, match="reward_range"):
        reg.register("acme/x-v1", EP, reward_range=(1.0, 0.0))


def test_package_pin_checks_the_installed_version():
    import importlib.metadata

    installed = importlib.metadata.version("molt-ecosystem")
    assert env_registry.spec(f"molt/gsm8k-v1@{installed}").package_version == installed
    with pytest.raises(PackageVersionMismatch, match="pins package version 9.9.9.*molt-env install"):
        env_registry.spec("molt/gsm8k-v1@9.9.9")


def test_make_gives_fresh_instances_with_kwargs_overlay_and_stamped_spec():
    a = env_registry.make("molt/gsm8k-v1")
    b = env_registry.make("molt/gsm8k-v1", grader_timeout_s=1.5)
    assert a is not b and type(a).__name__ == "GSM8KEnv"
    assert b.grader_timeout_s == 1.5 and b.spec.kwargs == {"grader_timeout_s": 1.5}
    assert a.spec.hash != b.spec.hash


def test_module_prefix_form_imports_the_registering_module(tmp_path, monkeypatch):
    (tmp_path / "my_registering_mod.py").write_text(
        "import env_registry\nenv_registry.register('local/thing-v1', 'molt_envs.envs.arith:ArithEnv')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = env_registry.make("my_registering_mod:local/thing-v1")
    assert type(env).__name__ == "ArithEnv" and env.spec.id == "local/thing-v1"
    with pytest.raises(NameNotFound, match="could not import module 'no_such_mod'"):
        env_registry.make("no_such_mod:local/thing-v1")


def test_registry_view_is_read_only_and_lists_builtins():
    assert "molt/gsm8k-v1" in env_registry.registry
    with pytest.raises(TypeError):
        env_registry.registry["x"] = None  # type: ignore[index]
    text = env_registry.pprint_registry(print_output=False)
    assert "===== molt =====" in text and "molt/gsm8k-v1" in text
