"""The package's own tests, run from its source tree (``pytest`` in this directory)."""

import asyncio
from pathlib import Path

import pytest
from acme_letter_count import LetterCountEnv, grade

from env_registry.datasets import load_split
from env_registry.manifest import EnvSpec, read_pyproject_manifests
from molt_envs.conformance import check_env

ROOT = Path(__file__).resolve().parents[1]
SPEC = EnvSpec(**read_pyproject_manifests(ROOT / "pyproject.toml")[0].model_dump())


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_reference_earns_full_reward(split):
    for row in load_split(SPEC, split):
        word, letter = row["row"]["word"], row["row"]["letter"]
        assert int(row["label"]) == word.count(letter), row
        assert grade(row["reference"], row["label"])["reward"] == 1.0, row


@pytest.mark.parametrize(
    ("response", "reward", "answered"),
    [
        ("\\boxed{3}", 1.0, True),
        ("I think \\boxed{2}... no, \\boxed{ 3 }", 1.0, True),
        ("\\boxed{4}", 0.0, True),
        ("\\boxed{three}", 0.0, True),
        ("3", 0.0, False),
    ],
)
def test_grade(response, reward, answered):
    scores = grade(response, "3")
    assert (scores["reward"], scores["answered"]) == (reward, answered)


def test_step_reads_the_action():
    state = {
        "observation_text": "",
        "action_text": "\\boxed{3}<|im_end|>",
        "label": "3",
        "sampling_params": None,
        "turn": 0,
        "images": [],
    }
    assert asyncio.run(LetterCountEnv().step(state)).reward == 1.0


def test_conformance():
    report = check_env(
        LetterCountEnv,
        load_split(SPEC, "train", limit=3),
        subject=SPEC.id,
        kind=SPEC.kind,
        reward_range=SPEC.reward_range,
        deterministic=SPEC.deterministic,
    )
    assert report.passed, report.render()
