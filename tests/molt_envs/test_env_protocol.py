"""The env protocol's messages: the committed JSON schema is the models', and the contract's objects round-trip."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from molt_envs import Result, SamplingParams
from molt_envs.remote.protocol import (
    CLIENT_MESSAGE,
    GAME_REPLY,
    PROTOCOL,
    STEP_REPLY,
    answer_result,
    dumps,
    protocol_json_schema,
    result_message,
    step_message,
    step_state,
)

SCHEMA = Path(__file__).resolve().parents[2] / "molt_envs" / "remote" / "protocol.schema.json"


def test_the_committed_schema_is_the_protocols():
    committed = json.loads(SCHEMA.read_text())
    assert committed == json.loads(json.dumps(protocol_json_schema())), (
        "regenerate molt_envs/remote/protocol.schema.json from protocol_json_schema() (and bump PROTOCOL_VERSION if a "
        "client of the previous schema would misread the new one)"
    )
    assert committed["protocol"] == PROTOCOL == "molt-env/1"


def test_a_result_crosses_the_wire_unchanged():
    result = Result(
        reward=0.5,
        observation="\nnext turn",
        terminated=False,
        truncated=True,
        info={"exact": 0.0, "nested": {"a": [1, 2]}, "nan": math.nan},
        score=0.25,
        sampling_params={"temperature": 0.3},
    )
    text = dumps(result_message(result))
    back = answer_result(STEP_REPLY.validate_json(text).data)
    assert math.isnan(back.info.pop("nan")) and math.isnan(result.info.pop("nan"))
    assert back == result


def test_a_step_state_crosses_the_wire_unchanged():
    state = {
        "observation_text": "1+2=",
        "action_text": "3<|im_end|>",
        "label": {"answer": 3},
        "sampling_params": SamplingParams(temperature=0.7, top_k=5, max_tokens=9, seed=11),
        "turn": 2,
        "images": [],
    }
    message = CLIENT_MESSAGE.validate_json(dumps(step_message(state)))
    assert step_state(message.data) == state


def test_images_are_refused_clearly_until_the_protocol_carries_them():
    state = {"observation_text": "", "action_text": "", "label": None, "sampling_params": SamplingParams()}
    with pytest.raises(NotImplementedError, match="cannot carry yet"):
        step_message({**state, "turn": 0, "images": [object()]})
    with pytest.raises(NotImplementedError, match="Result.images"):
        result_message(Result(images=[object()]))


def test_a_value_json_cannot_carry_is_an_error_not_a_silent_change():
    with pytest.raises(TypeError):
        dumps(result_message(Result(info={"when": object()})))


def test_a_game_call_and_its_answer_cross_the_wire_with_the_random_state():
    rng = random.Random(7)
    rng.random()
    version, internal, gauss = rng.getstate()
    data = {"seat": "player_1", "policy": "random", "rng_state": [version, list(internal), gauss]}
    message = CLIENT_MESSAGE.validate_json(dumps({"type": "play_policy", "data": data}))
    version, internal, gauss = message.data.rng_state
    again = random.Random()
    again.setstate((version, tuple(internal), gauss))
    assert again.random() == rng.random()
    answer = GAME_REPLY.validate_json(dumps({"type": "game", "data": {"to_move": None, "going": False}}))
    assert (answer.data.to_move, answer.data.going, answer.data.returns) == (None, False, None)
    with pytest.raises(ValueError, match="seat"):
        CLIENT_MESSAGE.validate_json(dumps({"type": "observe", "data": {"first": True}}))
