"""The built-in catalog: every ID passes ``molt-env check``, carries a dataset card ``molt-env info`` shows, and
``molt-env list`` groups and filters it; reasoning-gym tasks keep train and test apart and grade under a timeout."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import env_registry
from env_registry.cli import main
from env_registry.conformance import check
from env_registry.errors import ManifestError
from env_registry.manifest import manifests_from_catalog
from molt_envs import SamplingParams

BUILT_IN = sorted(i for i in env_registry.registry if env_registry.registry[i].package == "molt-ecosystem")
GAMES = ("molt/tictactoe-v1", "molt/tictactoe-v2", "molt/tictactoe-v3", "molt/tictactoe-v4", "molt/connect-four-v1")
CATALOG = [i for i in BUILT_IN if i.startswith(("gym/", "rg/")) or i in GAMES]
RG = [i for i in CATALOG if i.startswith("rg/")]


def test_the_catalog_has_the_promised_ids():
    assert len(RG) >= 10
    assert {"gym/frozen-lake-v1", "gym/taxi-v1", "gym/cliff-walking-v1", "gym/blackjack-v1"} <= set(CATALOG)
    assert {env_registry.spec(i).kind for i in GAMES} == {"game"} and set(GAMES) <= set(CATALOG)


@pytest.mark.parametrize("env_id", CATALOG)
def test_every_catalog_id_passes_molt_env_check(env_id):
    report = check(env_id)
    assert report.passed, report.render()


@pytest.mark.parametrize("env_id", BUILT_IN)
def test_every_built_in_has_a_dataset_card(env_id, capsys):
    spec = env_registry.spec(env_id)
    assert spec.card is not None and spec.card.source and spec.card.license and spec.card.held_out
    assert main(["info", env_id]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["card"] == spec.card.model_dump()
    for split, data in info["datasets"].items():
        assert data["source"] and (data.get("size") or data.get("rows")), (split, data)


def test_list_groups_by_namespace_and_filters_by_tag(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for namespace in ("gym", "molt", "rg"):
        assert f"===== {namespace} =====" in out
    for version in ("v1", "v2", "v3", "v4"):  # the board text changed in v2, v3, v4: every version stays listed
        line = next(x for x in out.splitlines() if x.split()[0] == f"molt/tictactoe-{version}")
        assert line.split()[1:5] == ["game", "text", "turns", "5"] and "self-play" in line
    assert main(["list", "--tag", "game"]) == 0
    games = [x.split()[0] for x in capsys.readouterr().out.splitlines() if not x.startswith("=")]
    assert set(games) == {i for i in env_registry.registry if "game" in env_registry.spec(i).tags}
    assert "molt/arith-v1" not in games and "molt/connect-four-v1" in games
    assert main(["list", "--tag", "no-such-tag"]) == 2
    assert "no env is tagged 'no-such-tag'; tags in use:" in capsys.readouterr().err


@pytest.mark.parametrize("env_id", RG)
def test_reasoning_gym_train_and_test_come_from_disjoint_seeds(env_id):
    spec = env_registry.spec(env_id)
    train, test = spec.datasets["train"].kwargs, spec.datasets["test"].kwargs
    assert train["seed"] + train["size"] <= test["seed"]  # item i comes from generator seed (seed + i)
    head = env_registry.load_split(spec, "train", 3)
    tail = env_registry.load_split(spec, "test", 3)
    assert {r["row"]["label"]["metadata"]["source_index"] for r in head} == {0, 1, 2}
    assert not {json.dumps(r["prompt"]) for r in head} & {json.dumps(r["prompt"]) for r in tail}


def test_difficulty_changes_the_data_of_the_split():
    spec, _ = env_registry.registry.factory("rg/countdown-v1", difficulty=1)
    hard = env_registry.load_split(spec, "test", 5)
    easy = env_registry.load_split(env_registry.spec("rg/countdown-v1"), "test", 5)
    numbers = [len(r["label"]["metadata"]["numbers"]) for r in hard]
    assert hard != easy and max(numbers) > max(len(r["label"]["metadata"]["numbers"]) for r in easy)


async def test_grading_runs_off_the_loop_and_a_slow_scorer_is_a_counted_timeout(monkeypatch):
    env = env_registry.make("rg/spell-backward-v1", grader_timeout_s=0.2)
    row = env_registry.load_split(env.spec, "test", 1)[0]
    state = {"action_text": row["reference"], "label": row["label"], "observation_text": "", "turn": 0}
    assert (await env.step({**state, "sampling_params": SamplingParams()})).reward == 1.0

    def slow(answer, entry):
        time.sleep(1.0)
        return 1.0

    monkeypatch.setattr(env.scorer, "score_answer", slow)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    result = await env.step({**state, "sampling_params": SamplingParams()})
    task.cancel()
    assert result.reward == 0.0 and result.info["grader_timeout"] == 1.0
    assert ticks > 5  # the loop kept running while the scorer was busy


def test_a_catalog_file_holds_only_env_tables():
    (manifest,) = manifests_from_catalog('[[env]]\nid = "a/b-v1"\nentry_point = "m:C"\n', "catalog.toml")
    assert manifest.id == "a/b-v1"
    with pytest.raises(ManifestError, match=r"a catalog holds only \[\[env\]\] tables, got keys \['tool'\]"):
        manifests_from_catalog("[tool.molt]\nx = 1\n", "catalog.toml")
    with pytest.raises(ManifestError, match="field 'card.held_out'"):
        manifests_from_catalog(
            '[[env]]\nid = "a/b-v1"\nentry_point = "m:C"\n[env.card]\nsource = "s"\nlicense = "MIT"\n', "c.toml"
        )
