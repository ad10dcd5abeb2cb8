"""EnvSpec round-trips and hashes stably; manifests fail with the field name and the offending value."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import env_registry
from env_registry import EnvSpec, ManifestError, manifest_json_schema
from env_registry.manifest import manifests_from_pyproject

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
