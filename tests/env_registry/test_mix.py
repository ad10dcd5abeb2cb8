"""``--env ID[:weight]``: IDs that hold ':' or '@' themselves, weights normalized, bad values named."""

from __future__ import annotations

import pytest

from env_registry import NameNotFound, spec
from env_registry.errors import InvalidEnvId
from env_registry.mix import InvalidEnvMix, MixEntry, parse_env_mix, split_weight


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("molt/arith-v1", ("molt/arith-v1", None)),
        ("molt/arith-v1:3", ("molt/arith-v1", 3.0)),
        ("molt/arith-v1:0.25", ("molt/arith-v1", 0.25)),
        ("ns/name-v1@1.4.2", ("ns/name-v1@1.4.2", None)),
        ("ns/name-v1@1.4.2:2", ("ns/name-v1@1.4.2", 2.0)),
        ("some.module:ns/name-v1", ("some.module:ns/name-v1", None)),
        ("some.module:ns/name-v1:1e-1", ("some.module:ns/name-v1", 0.1)),
        ("module:name-v1", ("module:name-v1", None)),
        ("http://host:8000/ns/name-v1", ("http://host:8000/ns/name-v1", None)),
        ("http://host:8000/ns/name-v1:5", ("http://host:8000/ns/name-v1", 5.0)),
    ],
)
def test_split_weight(value, expected):
    assert split_weight(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("molt/arith-v1:abc", "the weight 'abc' is not a number"),
        ("arith-v1:x2", "the weight 'x2' is not a number"),
        ("molt/arith-v1:0", "finite number > 0, got 0.0"),
        ("molt/arith-v1:-1", "finite number > 0, got -1.0"),
        ("molt/arith-v1:nan", "finite number > 0, got nan"),
        ("molt/arith-v1:", "ends with ':' but no weight"),
    ],
)
def test_bad_weights_name_the_value(value, message):
    with pytest.raises(InvalidEnvMix, match=message) as info:
        parse_env_mix([value])
    assert repr(value) in str(info.value)


def test_weights_are_normalized_in_order():
    assert parse_env_mix(["molt/arith-v1:3", "molt/gsm8k-v1"], resolve=spec) == [
        MixEntry("molt/arith-v1", 0.75),
        MixEntry("molt/gsm8k-v1", 0.25),
    ]


def test_unknown_duplicate_and_malformed_ids_fail_before_anything_starts():
    with pytest.raises(NameNotFound, match=r"--env 'molt/arith-v1x:2'.*not found"):
        parse_env_mix(["molt/arith-v1x:2"], resolve=spec)
    with pytest.raises(InvalidEnvMix, match="given twice"):
        parse_env_mix(["molt/arith-v1", "molt/arith-v1:2"])
    with pytest.raises(InvalidEnvId, match="--env 'bad id!'"):
        parse_env_mix(["bad id!"])
    with pytest.raises(InvalidEnvMix, match="at least one --env"):
        parse_env_mix([])


def test_the_lock_of_a_mix_names_each_env_and_what_changed_since(tmp_path):
    """``env_lock``: ID, package, version, spec hash, weight, kwargs, upstream per env; ``lock_changes`` names each
    env whose version, adapted library or kwargs (all in the spec hash) differ from an older lock's."""
    import json

    from env_registry.mix import LOCK_FILE, env_lock, lock_changes, write_lock

    mix = parse_env_mix(["molt/arith-v1:3", "rg:countdown"])
    lock = env_lock(mix)
    arith, countdown = lock["envs"]
    assert (arith["id"], arith["package"], arith["weight"]) == ("molt/arith-v1", "molt-ecosystem", 0.75)
    assert (arith["version"], arith["spec_hash"]) == (spec("molt/arith-v1").package_version, spec("molt/arith-v1").hash)
    assert countdown["weight"] == 0.25 and countdown["upstream"]["library"] == "reasoning-gym"
    assert countdown["spec_hash"] == spec("rg:countdown").hash and countdown["kwargs"]
    assert json.loads(write_lock(tmp_path, lock).read_text()) == lock and (tmp_path / LOCK_FILE).is_file()
    assert lock_changes(None, lock) == [] and lock_changes(lock, lock) == []

    old = json.loads(json.dumps(lock))
    old["envs"][0].update(version="0.0.1", spec_hash="0" * 16)
    old["envs"][1].update(spec_hash="1" * 16, upstream={**countdown["upstream"], "version": "0.0.9"})
    changes = lock_changes(old, lock)
    assert changes == [
        f"molt/arith-v1: molt-ecosystem 0.0.1 -> {arith['version']}, spec hash {'0' * 16} -> {arith['spec_hash']}",
        f"rg:countdown: reasoning-gym 0.0.9 -> {countdown['upstream']['version']}, "
        f"spec hash {'1' * 16} -> {countdown['spec_hash']}",
    ]
    # kwargs in the ID: a new given ID, matched to the old lock's by its spec ID
    with_kwargs = env_lock(parse_env_mix(["rg:countdown?shuffle=false"]))
    assert lock_changes(lock, with_kwargs) == [
        f"rg:countdown?shuffle=false: kwargs {countdown['kwargs']} -> {with_kwargs['envs'][0]['kwargs']}, "
        f"spec hash {countdown['spec_hash']} -> {with_kwargs['envs'][0]['spec_hash']}"
    ]
