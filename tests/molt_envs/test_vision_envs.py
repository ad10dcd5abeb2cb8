"""The vision envs: `molt/shapes-v1` (drawn answers, disjoint seeds, exact match), `molt/geo-tool-v1` (the figure in
the first turn, a real sandboxed tool call, the final answer graded) and its ChatAgent twin on the OpenAI SDK with
the figure as an image part, all on the tiny VLM's processor."""

from __future__ import annotations

import pytest
from chat_support import ScriptedEngine

import env_registry
import sandboxes
from molt_envs import ChatAgentRunner, SamplingParams, StepEnvRunner
from molt_envs.chat_runner import close_session_servers
from molt_envs.envs.chat_geo_tool import ChatGeoToolAgent
from molt_envs.envs.geo_tool import GeoToolEnv, make_row
from molt_envs.envs.shapes import COLOURS, ShapesEnv, generate_split, normalize
from molt_envs.vision import vision_codec

needs_sandbox = pytest.mark.skipif(
    sandboxes.probe().auto is None, reason="no sandbox provider works on this host (see sandboxes.probe())"
)


def test_shapes_splits_are_drawn_from_disjoint_seeds_and_every_answer_is_in_the_picture():
    spec = env_registry.spec("molt/shapes-v1")
    assert spec.modality == "vision" and spec.datasets["train"].image_key == "image"
    train, test = list(generate_split("train", 300)), list(generate_split("test", 100))
    assert not {r["seed"] for r in train} & {r["seed"] for r in test}
    assert {r["task"] for r in train} == {"count", "colour", "compare"}
    answers: dict[str, set[str]] = {}
    for row in train:
        answers.setdefault(row["question"], set()).add(row["answer"])
        drawn = {rgb for _, rgb in row["image"].getcolors()} - {(255, 255, 255)}
        if row["task"] == "colour":
            assert drawn == {COLOURS[row["answer"]]}  # the answer is the colour drawn
    assert all(len(a) > 1 for a in answers.values())  # no question gives its answer away: only the picture does
    row = env_registry.load_split(spec, "test", 1)[0]
    assert row["images"] == [row["row"]["image"]] and row["reference"] == row["label"]
    assert [r["seed"] for r in generate_split("test", 3)] == [r["seed"] for r in generate_split("test", 3)]


async def test_shapes_grader_is_exact_match_on_the_first_line():
    assert normalize("Red.<|im_end|>") == "red" and normalize("  3\nbecause") == "3"
    env = ShapesEnv()
    for text, reward in (("circles<|im_end|>", 1.0), ("squares", 0.0), ("circles are more", 0.0)):
        result = await env.step({"action_text": text, "label": "circles", "turn": 0})
        assert result.reward == reward and result.terminated


def calls_then_answers(codec, tokenizer, answer):
    def model(turn, prompt_ids):
        assert prompt_ids.count(codec.image_token_id) == 36  # the figure is in the context on every turn
        if turn == 0:
            code = "print(2 * 3 * 7)"
            return f'<tool_call>\n{{"name": "python_executor", "arguments": {{"code": "{code}"}}}}\n</tool_call>'
        assert "<tool_response>\n42\n</tool_response>" in tokenizer.decode(prompt_ids)  # the sandbox's real output
        return f"<answer>{answer}</answer>"

    return model


@needs_sandbox
async def test_geo_tool_episode_reads_the_figure_calls_the_sandbox_and_grades_the_answer(tiny_vl_engine):
    row = make_row(11)
    processor, tokenizer = tiny_vl_engine.processor, tiny_vl_engine.tokenizer
    codec = vision_codec(processor)
    engine = ScriptedEngine(tokenizer, calls_then_answers(codec, tokenizer, row["answer"]))
    traj = await StepEnvRunner(GeoToolEnv, max_turns=4).execute(
        [{"role": "user", "content": row["question"]}], row["answer"], SamplingParams(max_tokens=128), 1024,
        processor, engine, images=[row["image"]],
    )  # fmt: skip
    assert traj.ok, traj.failure
    assert traj.reward == 1.0 and traj.num_turns == 2 and traj.info["tool_calls"] == 1.0
    assert len(traj.images) == 1 and traj.mm_inputs.tensors["pixel_values"].shape[0] == 1


@needs_sandbox
async def test_chat_geo_tool_sends_the_figure_as_an_image_part_through_the_openai_sdk(tiny_vl_engine):
    row = make_row(12)
    processor, tokenizer = tiny_vl_engine.processor, tiny_vl_engine.tokenizer
    engine = ScriptedEngine(tokenizer, calls_then_answers(vision_codec(processor), tokenizer, row["answer"]))
    runner = ChatAgentRunner(ChatGeoToolAgent, env_id="molt/chat-geo-tool-v1")
    try:
        [segment] = await runner.execute(
            row["question"], row["answer"], SamplingParams(max_tokens=128), 2048, processor, engine,
            images=[row["image"]],
        )  # fmt: skip
    finally:
        await close_session_servers()
    assert segment.failure is None and segment.reward == 1.0
    assert segment.info == {"correct": 1.0, "tool_calls": 1.0, "turns": 2.0}
    assert len(segment.images) == 1 and len(segment.action_ranges) == 2  # one token-exact segment, the figure in it
    assert segment.images[0].tobytes() == row["image"].tobytes()  # sent as a PNG data URI, decoded losslessly
