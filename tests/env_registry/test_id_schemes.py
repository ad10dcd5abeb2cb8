"""The registry's side of other ecosystems' IDs: ``ID?key=value`` kwargs (hashed, checked at ``make``), ``SCHEME:NAME``
taking precedence over ``module:ID``, the ``molt.sources`` entry points, and the eval's check of upstream versions."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

import env_registry
from env_registry.errors import Error, InvalidEnvId, NameNotFound, RegistrationError
from env_registry.evaluation.run import evaluate, upstream_changes
from env_registry.evaluation.tasks import EnvTask, EvalSettings
from env_registry.ids import split_kwargs
from env_registry.mix import split_weight
from env_registry.sources import for_scheme, sources


@pytest.mark.parametrize(
    ("env_id", "expected"),
    [
        ("molt/sort-v1", ("molt/sort-v1", {})),
        ("rg:countdown?min_numbers=3", ("rg:countdown", {"min_numbers": 3})),
        ("a?x=true&y=abc&z=%5B1%2C2%5D&w=1.5", ("a", {"x": True, "y": "abc", "z": [1, 2], "w": 1.5})),
        ('a?s="3"', ("a", {"s": "3"})),  # a JSON string stays a string
    ],
)
def test_kwargs_parse_as_json_where_they_do(env_id, expected):
    assert split_kwargs(env_id) == expected


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("a?novalue", "'novalue' is not key=value"),
        ("a?=3", "'=3' is not key=value"),
        ("a?1x=3", "'1x=3' is not key=value"),
        ("a?x=1&x=2", "the kwarg 'x' is given twice"),
    ],
)
def test_malformed_kwargs_name_the_part(env_id, message):
    with pytest.raises(InvalidEnvId, match=message):
        split_kwargs(env_id)


def test_kwargs_of_our_own_ids_change_the_spec_hash_and_reach_the_env():
    plain = env_registry.spec("molt/python-tool-v1")
    tuned = env_registry.spec("molt/python-tool-v1?max_output_chars=300")
    assert tuned.id == plain.id and tuned.kwargs == {**plain.kwargs, "max_output_chars": 300}
    assert tuned.hash != plain.hash
    assert env_registry.make("molt/python-tool-v1?max_output_chars=300").tools.max_chars == 300


def test_a_kwarg_the_env_does_not_take_fails_at_make_naming_it():
    with pytest.raises(RegistrationError, match="takes no kwarg 'nope'"):
        env_registry.make("molt/python-tool-v1?nope=1")


def test_known_schemes_come_from_entry_points_and_win_over_the_module_form():
    schemes = {scheme for source in sources() for scheme in source.schemes}
    assert {"http", "https", "rg"} <= schemes
    assert for_scheme("rg:countdown") is not None
    assert for_scheme("molt/sort-v1") is None
    assert for_scheme("tests.env_registry.eval_envs:acme/x-v1") is None  # no such scheme: the module form


def test_an_unknown_scheme_lists_the_known_ones():
    with pytest.raises(NameNotFound, match=r"known schemes: .*rg:"):
        env_registry.spec("nosuchscheme:thing")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("rg:countdown", ("rg:countdown", None)),
        ("rg:countdown:0.5", ("rg:countdown", 0.5)),
        ("rg:countdown?min_numbers=3:2", ("rg:countdown?min_numbers=3", 2.0)),
        ("openenv:http://127.0.0.1:8000", ("openenv:http://127.0.0.1:8000", None)),  # a port, not a weight
        ("openenv:http://127.0.0.1:8000/:3", ("openenv:http://127.0.0.1:8000/", 3.0)),
    ],
)
def test_mix_weights_after_scheme_ids(value, expected):
    assert split_weight(value) == expected


def test_an_eval_names_both_versions_of_a_changed_upstream_library(tmp_path):
    spec = env_registry.spec("rg:countdown")
    assert spec.upstream["library"] == "reasoning-gym" and spec.upstream["version"]
    header = {"upstream": {"rg:countdown": {**spec.upstream, "version": "0.0.1"}}}
    (message,) = upstream_changes(header, {"rg:countdown": spec})
    assert "reasoning-gym 0.0.1" in message and f"reasoning-gym {spec.upstream['version']}" in message
    assert upstream_changes({"upstream": {"rg:countdown": spec.upstream}}, {"rg:countdown": spec}) == []


def test_a_native_spec_hash_is_unchanged_by_the_upstream_field():
    spec = env_registry.spec("molt/sort-v1")
    data = spec.model_dump(mode="json")
    assert data["upstream"] == {}
    del data["upstream"]  # the hash is over the fields the spec had before foreign envs came
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    assert spec.hash == hashlib.sha256(canonical.encode()).hexdigest()[:16]


def test_eval_resume_refuses_another_upstream_version(tmp_path):
    out = tmp_path / "eval"
    out.mkdir()
    spec = env_registry.spec("rg:countdown")
    header = {"upstream": {"rg:countdown": {**spec.upstream, "version": "0.0.1"}}}
    (out / "eval.json").write_text(json.dumps({"model": "m", "sampling": {}, "specs": {}, **header}))
    task = EnvTask("rg:countdown", spec, lambda: None, [], 1.0)
    with pytest.raises(Error, match=r"reasoning-gym 0\.0\.1.*install that version"):
        asyncio.run(evaluate([task], policy=None, settings=EvalSettings(n=1), out=out))  # type: ignore[arg-type]
