"""Images through StepEnvRunner on the tiny VLM: the processor's expanded ids are the trajectory's, its tensors ride
along aligned (first prompt, reset, ``Result.images``), the engine generates with them, and bad images end only their
episode. Decoding untrusted images: every form accepted, every bad one refused by name."""

from __future__ import annotations

import base64
import io

import pytest
import torch
from chat_support import RecordingEngine
from PIL import Image

from molt_envs import Env, Result, SamplingParams, StepEnvRunner
from molt_envs.envs.shapes import ShapesEnv, make_row
from molt_envs.vision import ImageError, load_image, place_images, vision_codec


def png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_images_decode_from_every_accepted_form_and_bad_ones_are_refused_by_name():
    image = Image.new("RGB", (5, 3), (10, 20, 30))
    data = png(image)
    text = base64.b64encode(data).decode()
    for form in (image, data, text, "data:image/png;base64," + text, Image.new("L", (5, 3), 7)):
        assert load_image(form).size == (5, 3) and load_image(form).mode == "RGB"
    assert load_image("data:image/png;base64," + text).tobytes() == image.tobytes()
    with pytest.raises(ImageError, match="remote URL .* never fetched"):
        load_image("https://example.com/cat.png", "messages[0]")
    with pytest.raises(ImageError, match="image 2 is not a decodable image"):
        load_image(b"\x89PNG not really", "image 2")
    with pytest.raises(ImageError, match="neither an image nor valid base64"):
        load_image("%%%")
    with pytest.raises(ImageError, match="corrupt image"):
        noisy = png(Image.frombytes("RGB", (32, 32), bytes(range(256)) * 12))
        load_image(noisy[: len(noisy) // 2])  # a valid header, truncated pixels
    with pytest.raises(ImageError, match="is 5000x5000 pixels; the limit is"):
        load_image(png(Image.new("1", (5000, 5000))))  # tiny when encoded, huge when decoded
    with pytest.raises(ImageError, match="limit is 10"):
        load_image(data, max_bytes=10)


def test_images_are_placed_in_parts_in_order():
    a, b = Image.new("RGB", (2, 2)), Image.new("RGB", (3, 3))
    messages, order = place_images([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], [a, b])
    assert order == [a, b]
    assert messages[1]["content"] == [
        {"type": "image", "image": a},
        {"type": "image", "image": b},
        {"type": "text", "text": "q"},
    ]
    inline = [
        {"role": "user", "content": [{"type": "image", "image": b}, {"type": "text", "text": "q"}, {"type": "image"}]}
    ]
    assert place_images(inline, [a])[1] == [b, a]
    with pytest.raises(ImageError, match="without an image part"):
        place_images(inline, [a, a])
    with pytest.raises(ImageError, match="more image parts"):
        place_images(inline, [])


class LookAgain(Env):
    """Turn 0: a second picture in a user message (``Result.images``); turn 1 ends."""

    def __init__(self):
        self.states = []

    async def step(self, state):
        self.states.append(state)
        if state["turn"] == 0:
            observation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and now?"}]}]
            return Result(observation=observation, images=[Image.new("RGB", (40, 30), (0, 0, 255))], terminated=False)
        return Result(reward=1.0)


def expected(codec, tokenizer, messages, images):
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return codec.processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)


async def test_prompt_and_later_images_are_expanded_by_the_processor_and_travel_aligned(tiny_vl_engine):
    engine, processor = RecordingEngine(tiny_vl_engine), tiny_vl_engine.processor
    codec, tokenizer = vision_codec(processor), tiny_vl_engine.tokenizer
    first = Image.new("RGB", (64, 64), (255, 0, 0))
    prompt = [{"role": "user", "content": "What colour?"}]
    envs = []
    params = SamplingParams(max_tokens=3, seed=0, stop_token_ids=list(range(len(tokenizer))))  # one token per turn
    traj = await StepEnvRunner(lambda: envs.append(LookAgain()) or envs[-1]).execute(
        prompt, None, params, 512, processor, engine, images=[first]
    )
    assert traj.ok and traj.num_turns == 2, traj.failure
    placed, _ = place_images(prompt, [first])
    want = expected(codec, tokenizer, placed, [first])
    prompt_ids = want["input_ids"][0].tolist()
    assert traj.token_ids[: len(prompt_ids)] == prompt_ids and traj.prompt_len == len(prompt_ids)
    assert prompt_ids.count(codec.image_token_id) == 36  # (48 / 8) ** 2 patches, one placeholder each
    # what the engine generated with: the exact ids so far and the tensors of every image in them
    (ctx0, _, _), (ctx1, _, _) = engine.calls
    assert ctx0 == prompt_ids and ctx1 == traj.token_ids[: traj.action_ranges[1][0]]
    assert traj.token_ids.count(codec.image_token_id) == 72 and len(traj.images) == 2
    assert traj.images[0] is first and traj.mm_inputs.images == traj.images
    pixels = traj.mm_inputs.tensors["pixel_values"]
    assert pixels.shape == (2, 3, 48, 48) and torch.equal(pixels[:1], want["pixel_values"])
    assert [len(s["images"]) for s in envs[0].states] == [1, 2]
    assert all(not m for m, t in zip(traj.action_mask(), traj.token_ids, strict=True) if t == codec.image_token_id)


async def test_a_shapes_row_runs_end_to_end_and_its_group_shares_one_processing(tiny_vl_engine):
    row = make_row(7)
    runner = StepEnvRunner(ShapesEnv)
    params = SamplingParams(max_tokens=4, seed=1)
    trajs = [
        await runner.execute([{"role": "user", "content": row["question"]}], row["answer"], params, 256,
                             tiny_vl_engine.processor, tiny_vl_engine, images=[row["image"]])
        for _ in range(2)
    ]  # fmt: skip
    assert all(t.ok and t.reward in (0.0, 1.0) for t in trajs)
    assert trajs[0].mm_inputs is trajs[1].mm_inputs  # the prompt cache keys images by content: processed once


class TooMany(Env):
    async def step(self, state):
        return Result(observation=[{"role": "user", "content": "more"}], images=[Image.new("RGB", (8, 8))] * 8,
                      terminated=False)  # fmt: skip


async def test_bad_images_end_only_their_episode_with_a_counted_reason(tiny_vl_engine):
    runner = StepEnvRunner(ShapesEnv)
    params = SamplingParams(max_tokens=2, seed=0)
    q = [{"role": "user", "content": "How many?"}]
    corrupt = await runner.execute(q, "1", params, 256, tiny_vl_engine.processor, tiny_vl_engine, images=[b"junk"])
    assert corrupt.failure.startswith("images: ImageError: image 0 is not a decodable image")
    remote = await runner.execute(q, "1", params, 256, tiny_vl_engine.processor, tiny_vl_engine,
                                  images=["http://example.com/x.png"])  # fmt: skip
    assert "remote URL" in remote.failure and "never fetched" in remote.failure
    extra = await runner.execute("raw text, no placeholder", "1", params, 256, tiny_vl_engine.processor,
                                 tiny_vl_engine, images=[Image.new("RGB", (8, 8))])  # fmt: skip
    assert "places 0 image(s)" in extra.failure
    flood = await StepEnvRunner(TooMany).execute(
        q, "1", params, 4096, tiny_vl_engine.processor, tiny_vl_engine, images=[Image.new("RGB", (8, 8))]
    )
    assert flood.failure == "images: ImageError: 9 images exceed the model's limit of 8 per context"
    fine = await runner.execute(q, "1", params, 256, tiny_vl_engine.processor, tiny_vl_engine,
                                images=[Image.new("RGB", (8, 8))])  # fmt: skip
    assert fine.ok  # the runner and the engine are unharmed


async def test_an_observation_that_does_not_fit_drops_its_images_whole(tiny_vl_engine):
    codec = vision_codec(tiny_vl_engine.processor)
    params = SamplingParams(max_tokens=1, seed=0, stop_token_ids=list(range(len(tiny_vl_engine.tokenizer))))
    q = [{"role": "user", "content": "What colour?"}]
    traj = await StepEnvRunner(LookAgain).execute(
        q, None, params, 60, tiny_vl_engine.processor, tiny_vl_engine, images=[Image.new("RGB", (8, 8))]
    )
    assert traj.ok and traj.truncated and len(traj.token_ids) <= 60
    assert traj.token_ids.count(codec.image_token_id) == 36 and len(traj.mm_inputs) == 1  # no half image
