"""EnvSpec round-trips and hashes stably; manifests fail with the field name and the offending value."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import env_registry
from env_registry import EnvSpec, ManifestError, manifest_json_schema
from env_registry.manifest import manifests_from_catalog, manifests_from_pyproject

GOOD = """
[tool.molt.env]
id = "acme/echo-v1"
entry_point = "acme_echo.env:EchoEnv"
reward_range = [0, 1]
[tool.molt.env.datasets.train]
path = "data/train.jsonl"
"""


def test_spec_json_round_trip_and_hash():
    spec = env_registry.spec("molt/gsm8k-v1")
    again = EnvSpec.from_json(spec.to_json())
    assert again == spec and again.hash == spec.hash
    assert json.loads(spec.to_json())["datasets"]["test"]["path"] == "data/gsm8k/test.jsonl"
    bumped = spec.model_copy(update={"package_version": "0.1.1"})
    assert bumped.hash != spec.hash  # the package version is part of the hash


def test_hash_is_stable_across_processes():
    code = "import env_registry; print(env_registry.spec('molt/gsm8k-v1').hash)"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == env_registry.spec("molt/gsm8k-v1").hash


def test_spec_from_json_rejects_unknown_fields():
    data = json.loads(env_registry.spec("molt/gsm8k-v1").to_json())
    data["surprise"] = 1
    with pytest.raises(ValueError, match="surprise"):
        EnvSpec.from_json(json.dumps(data))


def test_good_manifest_parses():
    (manifest,) = manifests_from_pyproject(GOOD, "pyproject.toml")
    assert manifest.id == "acme/echo-v1" and manifest.datasets["train"].path == "data/train.jsonl"


@pytest.mark.parametrize(
    ("old", "new", "field", "shown"),
    [
        ('id = "acme/echo-v1"', 'id = "acme//echo"', "id", "'acme//echo'"),
        ('entry_point = "acme_echo.env:EchoEnv"', 'entry_point = "acme echo"', "entry_point", "'acme echo'"),
        ("reward_range = [0, 1]", "reward_range = [2, 1]", "reward_range", "[2, 1]"),
        ('path = "data/train.jsonl"', 'path = "../../etc/passwd"', "datasets.train", "../../etc/passwd"),
        ("reward_range = [0, 1]", 'reward_range = [0, 1]\ncolour = "red"', "colour", "'red'"),
    ],
)
def test_bad_manifest_names_field_and_value(old, new, field, shown):
    with pytest.raises(ManifestError) as info:
        manifests_from_pyproject(GOOD.replace(old, new), "pyproject.toml")
    message = str(info.value)
    assert f"field {field!r}" in message and shown in message, message


def test_missing_table_and_bad_toml_are_explained():
    with pytest.raises(ManifestError, match=r"no \[tool.molt.env\] table"):
        manifests_from_pyproject("[project]\nname = 'x'\n", "p.toml")
    with pytest.raises(ManifestError, match="not valid TOML"):
        manifests_from_pyproject("[tool.molt.env\n", "p.toml")


def test_json_schema_is_exported():
    schema = manifest_json_schema()
    assert schema["additionalProperties"] is False
    assert {"id", "entry_point"} <= set(schema["required"])
    assert "datasets" in schema["properties"]


def test_every_builtin_manifest_validates_and_resolves():
    builtins = [i for i in env_registry.registry if i.startswith("molt/")]  # other tests register run-time envs
    assert len(builtins) >= 6
    for env_id in builtins:
        spec = env_registry.spec(env_id)
        assert spec.package == "molt-ecosystem"
        for split in spec.datasets:
            assert env_registry.count_rows(spec, split) > 0


SHORT = """
[project.entry-points."molt.envs"]
"acme/echo-v1" = "acme_echo.env:EchoEnv"
[tool.molt.env]
input_key = "question"
label_key = "answer"
prompt_template = "{input}!"
datasets.train.path = "data/train.jsonl"
datasets.test = { path = "data/test.jsonl", prompt_template = "{input}?" }
"""

LONG = """
[tool.molt.env]
id = "acme/echo-v1"
entry_point = "acme_echo.env:EchoEnv"
[tool.molt.env.datasets.train]
path = "data/train.jsonl"
input_key = "question"
label_key = "answer"
prompt_template = "{input}!"
[tool.molt.env.datasets.test]
path = "data/test.jsonl"
input_key = "question"
label_key = "answer"
prompt_template = "{input}?"
"""


def test_the_short_form_makes_the_manifest_the_long_form_does():
    (short,) = manifests_from_pyproject(SHORT, "short.toml")
    (long,) = manifests_from_pyproject(LONG, "long.toml")
    assert short == long
    assert short.datasets["train"].prompt_template == "{input}!"  # the shared default
    assert short.datasets["test"].prompt_template == "{input}?"  # a split's own value wins
    assert EnvSpec(**short.model_dump()).hash == EnvSpec(**long.model_dump()).hash


def test_an_explicit_entry_point_is_kept_and_an_id_is_derived_only_from_a_single_entry_point():
    explicit = SHORT.replace("[tool.molt.env]\n", '[tool.molt.env]\nentry_point = "other.mod:Env"\n')
    assert manifests_from_pyproject(explicit, "p.toml")[0].entry_point == "other.mod:Env"
    two = SHORT.replace('"acme/echo-v1" = ', '"acme/echo-v2" = "acme_echo.env:Echo2"\n"acme/echo-v1" = ')
    with pytest.raises(ManifestError) as info:
        manifests_from_pyproject(two, "p.toml")
    assert "field 'id': Field required; give the env ID" in str(info.value)
    (named,) = manifests_from_pyproject(two.replace("[tool.molt.env]\n", '[tool.molt.env]\nid = "acme/echo-v2"\n'), "p")
    assert (named.id, named.entry_point) == ("acme/echo-v2", "acme_echo.env:Echo2")


def test_an_id_without_an_entry_point_says_what_to_add():
    text = SHORT.replace("[tool.molt.env]\n", '[tool.molt.env]\nid = "acme/echo-v9"\n')
    with pytest.raises(ManifestError) as info:
        manifests_from_pyproject(text, "p.toml")
    assert """field 'entry_point': Field required; add "acme/echo-v9" = "package.module:Class" to""" in str(info.value)


def test_split_defaults_without_splits_are_refused():
    text = SHORT.split("datasets.train")[0]
    with pytest.raises(ManifestError, match=r"\['input_key', 'label_key', 'prompt_template'\] are defaults for the"):
        manifests_from_pyproject(text, "p.toml")
    with pytest.raises(ManifestError, match=r"field 'datasets.train.input_key'.*\(got 3\)"):
        manifests_from_pyproject(SHORT.replace('input_key = "question"', "input_key = 3"), "p.toml")


def test_a_catalog_takes_entry_points_from_its_package():
    catalog = '[[env]]\nid = "acme/a-v1"\n[[env]]\nid = "acme/b-v1"\nentry_point = "acme.b:B"\n'
    a, b = manifests_from_catalog(catalog, "catalog.toml", {"acme/a-v1": "acme.a:A", "acme/b-v1": "acme.b:B"})
    assert (a.entry_point, b.entry_point) == ("acme.a:A", "acme.b:B")
    with pytest.raises(ManifestError, match="field 'entry_point'"):
        manifests_from_catalog(catalog, "catalog.toml")
