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
