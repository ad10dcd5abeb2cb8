"""`molt/sort-v1`: disjoint splits, hand-computed partial credit, exact match as the score."""

from __future__ import annotations

import pytest

import env_registry
from molt_envs.envs.sort import SortEnv, generate_split, partial_credit


def test_splits_are_disjoint_sorted_and_deterministic():
    train = list(generate_split("train", size=3000))
    test = list(generate_split("test", size=300))
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert train == list(generate_split("train", size=3000))
    for row in train[:50]:
        digits = row["question"].removeprefix("sort:").removesuffix("=")
        assert 3 <= len(digits) <= 6 and row["answer"] == "".join(sorted(digits))


@pytest.mark.parametrize(
    ("answer", "target", "credit"),
    [("1234", "1234", 1.0), ("1243", "1234", 0.5), ("123", "1234", 0.75), ("123456", "1234", 4 / 6), ("", "12", 0.0)],
)
def test_partial_credit_counts_positions_over_the_longer(answer, target, credit):
    assert partial_credit(answer, target) == pytest.approx(credit)


async def test_reward_is_partial_credit_and_score_is_exact():
    env = SortEnv()
    half = await env.step({"action_text": "1243<|im_end|>", "label": "1234", "observation_text": "", "turn": 0})
    exact = await env.step({"action_text": " 1234 <|im_end|>", "label": "1234", "observation_text": "", "turn": 0})
    assert (half.reward, half.score) == (0.5, 0.0)
    assert (exact.reward, exact.score) == (1.0, 1.0)


def test_registered_with_a_held_out_split():
    spec = env_registry.spec("molt/sort-v1")
    rows = env_registry.load_split(spec, "test", 3)
    assert rows[0]["label"] == rows[0]["reference"]
    assert env_registry.count_rows(spec, "train") == 20000


@pytest.mark.parametrize("kwargs", [{"split": "dev"}, {"split": "train", "min_digits": 0}])
def test_bad_arguments_name_the_value(kwargs):
    with pytest.raises(ValueError, match="dev|min_digits"):
        next(generate_split(**kwargs))
