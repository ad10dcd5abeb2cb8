"""Images on the session server's three wires, with the stock SDKs and the tiny VLM: captured token-exactly (the
processor's expanded ids, the image tensors aligned with them, log-probs a teacher-forced pass reproduces), plain and
streaming; remote URLs, bad images, too many images and images for a text-only model are 4xx naming the problem."""

from __future__ import annotations

import base64
import io

import anthropic
import openai
import pytest
import torch
from chat_support import RecordingEngine

from molt_envs import SamplingParams
from molt_envs.envs.shapes import make_row
from molt_envs.vision import vision_codec


def b64(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def image_url(image) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(image)}"}}


def rendered_ids(processor, messages, images):
    """What the processor makes of the conversation rendered with the generation prompt."""
    text = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)


def assert_forced_logprobs_match(model, segment):
    """A teacher-forced pass over the segment's ids with its image tensors reproduces every action log-prob."""
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([segment.token_ids]), pixel_values=segment.mm_inputs.tensors["pixel_values"]
        ).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    for start, end in segment.action_ranges:
        forced = logp[start - 1 : end - 1].gather(-1, torch.tensor(segment.token_ids[start:end])[:, None])[:, 0]
        assert torch.allclose(forced, torch.tensor(segment.log_probs[start:end]), atol=1e-4)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
async def test_openai_image_url_parts_are_captured_token_exactly_over_two_turns(serve, tiny_vl_engine, stream):
    engine, processor = RecordingEngine(tiny_vl_engine), tiny_vl_engine.processor
    server = await serve(engine, processor, params=SamplingParams(max_tokens=6, seed=1))
    session = server.open_session()
    client = serve.openai(server, session)
    first, second = make_row(3)["image"], make_row(4)["image"]
    messages = [{"role": "user", "content": [image_url(first), {"type": "text", "text": "How many shapes?"}]}]

    async def ask(messages):
        if not stream:
            return (await client.chat.completions.create(model="policy", messages=messages)).choices[0].message.content
        chunks = await client.chat.completions.create(model="policy", messages=messages, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

    reply = await ask(messages)
    messages += [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": [{"type": "text", "text": "And here?"}, image_url(second)]},
    ]
    await ask(messages)
    [segment] = session.segments  # the second image extended the first turn's ids: one token-exact segment
    codec = vision_codec(processor)
    first_prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many shapes?"}]}]
    want = rendered_ids(processor, first_prompt, [first])
    assert engine.calls[0][0] == want["input_ids"][0].tolist() == segment.token_ids[: segment.prompt_len]
    assert torch.equal(engine.mm[0].tensors["pixel_values"], want["pixel_values"])
    assert segment.token_ids.count(codec.image_token_id) == 72 and len(segment.images) == 2
    assert engine.calls[1][0] == segment.token_ids[: segment.action_ranges[1][0]]
    assert len(engine.mm[1]) == 2 and segment.mm_inputs.tensors["pixel_values"].shape == (2, 3, 48, 48)
    assert_forced_logprobs_match(tiny_vl_engine.model, segment)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
async def test_anthropic_base64_image_blocks_in_user_turns_and_tool_results(serve, tiny_vl_engine, stream):
    processor = tiny_vl_engine.processor
    server = await serve(tiny_vl_engine, processor, params=SamplingParams(max_tokens=5, seed=2))
    session = server.open_session()
    client = serve.anthropic(server, session)
    picture = make_row(5)["image"]
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(picture)}}
    messages = [{"role": "user", "content": [block, {"type": "text", "text": "What colour?"}]}]
    if stream:
        async with client.messages.stream(model="policy", max_tokens=5, messages=messages) as events:
            message = await events.get_final_message()
    else:
        message = await client.messages.create(model="policy", max_tokens=5, messages=messages)
    assert message.role == "assistant"
    [segment] = session.segments
    want = rendered_ids(
        processor,
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}],
        [picture],
    )
    assert segment.token_ids[: segment.prompt_len] == want["input_ids"][0].tolist()
    assert torch.equal(segment.mm_inputs.tensors["pixel_values"], want["pixel_values"])
    count = await client.messages.count_tokens(model="policy", messages=messages)
    assert count.input_tokens == segment.prompt_len  # the 36 patch placeholders are counted
    # a screenshot returned by a tool: an image block inside tool_result content
    tool = {"name": "look", "description": "take a picture", "input_schema": {"type": "object"}}
    history = [
        {"role": "user", "content": "Look."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [block]}]},
    ]
    other = server.open_session()
    await serve.anthropic(server, other).messages.create(model="policy", max_tokens=3, messages=history, tools=[tool])
    assert len(other.segments[0].images) == 1 and other.segments[0].mm_inputs is not None


async def test_responses_input_image_parts(serve, tiny_vl_engine):
    server = await serve(tiny_vl_engine, tiny_vl_engine.processor, params=SamplingParams(max_tokens=4, seed=0))
    session = server.open_session()
    picture = make_row(6)["image"]
    content = [
        {"type": "input_image", "image_url": f"data:image/png;base64,{b64(picture)}"},
        {"type": "input_text", "text": "Count them."},
    ]
    response = await serve.openai(server, session).responses.create(
        model="policy", input=[{"role": "user", "content": content}], max_output_tokens=4
    )
    assert response.status in ("completed", "incomplete")
    assert len(session.segments[0].images) == 1
    assert torch.equal(
        session.segments[0].mm_inputs.tensors["pixel_values"],
        rendered_ids(tiny_vl_engine.processor, [{"role": "user", "content": [{"type": "image"}]}], [picture])[
            "pixel_values"
        ],
    )


async def test_remote_urls_bad_images_and_too_many_are_4xx_naming_the_problem(serve, tiny_vl_engine, tiny_engine,
                                                                              tiny_tokenizer):  # fmt: skip
    server = await serve(tiny_vl_engine, tiny_vl_engine.processor, params=SamplingParams(max_tokens=2))
    session = server.open_session()
    client, claude = serve.openai(server, session, max_retries=0), serve.anthropic(server, session, max_retries=0)
    small = make_row(1)["image"]

    async def refused(content, match):
        with pytest.raises(openai.BadRequestError, match=match):
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": content}])

    await refused([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}], "fetches no URLs")
    await refused([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], "not a decodable image")
    await refused([image_url(small)] * 9, "holds 9 images; the model's limit is 8")
    await refused([{"type": "text", "text": "<image> typed by hand"}, image_url(small)], "places 2 image")
    from PIL import Image

    await refused([image_url(Image.new("1", (5000, 5000)))], "5000x5000 pixels")
    url_block = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    with pytest.raises(anthropic.BadRequestError, match="fetches no URLs"):
        await claude.messages.create(model="policy", max_tokens=2, messages=[{"role": "user", "content": [url_block]}])
    assert session.segments == []  # nothing was recorded
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": [image_url(small)]}]
    )
    assert reply.choices[0].finish_reason in ("stop", "length")  # the session still serves
    text_server = await serve(tiny_engine, tiny_tokenizer)
    text_session = text_server.open_session()
    with pytest.raises(openai.BadRequestError, match="text-only"):
        await serve.openai(text_server, text_session, max_retries=0).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": [image_url(small)]}]
        )
