"""Token-exact capture through the session server: real server on loopback, stock OpenAI SDK, a real tiny model.

The scripted engine (a test double) is used where the test must choose what the model says: an end-of-turn token,
a ``<think>`` block, tool calls.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time

import httpx
import openai
import pytest
import torch
from chat_support import CALC_TOOL, RecordingEngine, ScriptedEngine, encode, render

from molt_envs import SamplingParams
from molt_envs.sessions.session import INLINE_MAX_CHARS, ChatRequest, ChatTemplate, Session


async def chat(client, messages, **kwargs):
    return await client.chat.completions.create(model="policy", messages=messages, **kwargs)


@pytest.mark.parametrize("inline_max_chars", [INLINE_MAX_CHARS, -1], ids=["small-work-inline", "all-on-the-pool"])
async def test_multi_turn_is_token_exact_and_log_probs_are_the_engines(
    serve, tiny_engine, tiny_model, tiny_tokenizer, inline_max_chars
):
    tok = tiny_tokenizer
    engine = RecordingEngine(tiny_engine)
    server = await serve(engine, tok, params=SamplingParams(max_tokens=10, seed=3))
    session = server.open_session()
    session.inline_max_chars = inline_max_chars
    client = serve.openai(server, session)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Janet has 3 ducks."}]
    requests = []
    for turn in range(3):
        requests.append(list(messages))
        reply = await chat(client, messages, max_tokens=10, temperature=1.0)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"And after day {turn}?"},
        ]

    [segment] = session.segments
    assert len(engine.calls) == 3
    context: list[int] = []
    for i, (prompt, _, gen) in enumerate(engine.calls):
        if i == 0:
            assert prompt == encode(tok, render(tok, requests[0]))
        else:
            # generated over the exact accumulated ids, plus only the template delta of the new message
            assert prompt[: len(context)] == context
            previous = engine.calls[i - 1][2]
            closing = "\n" if previous.finish_reason == "stop" else "<|im_end|>\n"
            full, prefix = render(tok, requests[i]), render(tok, requests[i][:-1], generation_prompt=False)
            assert prompt[len(context) :] == encode(tok, closing + full[len(prefix) :])
        context = prompt + gen.token_ids
    assert segment.token_ids == context
    assert segment.action_ranges == [(len(p), len(p) + len(g.token_ids)) for p, _, g in engine.calls]
    assert segment.prompt_len == len(engine.calls[0][0])
    mask = segment.action_mask()
    assert [lp for lp, m in zip(segment.log_probs, mask, strict=True) if not m] == [0.0] * mask.count(False)
    assert [lp for lp, m in zip(segment.log_probs, mask, strict=True) if m] == [
        lp for _, _, g in engine.calls for lp in g.log_probs
    ]
    # the model really saw these ids: a teacher-forced pass over them reproduces every action log-prob
    with torch.no_grad():
        logits = tiny_model(torch.tensor([segment.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    for start, end in segment.action_ranges:
        forced = logp[start - 1 : end - 1].gather(-1, torch.tensor(segment.token_ids[start:end])[:, None])[:, 0]
        assert torch.allclose(forced, torch.tensor(segment.log_probs[start:end]), atol=1e-4)


async def test_template_text_after_end_of_turn_is_kept_so_capture_matches_a_fresh_render(serve, tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine(tok, ["Four.", "It is 5.", "Six"])
    server = await serve(engine, tok)
    session = server.open_session()
    client = serve.openai(server, session)
    messages = [{"role": "user", "content": "2+2?"}]
    for question in ("plus one?", "plus one again?", None):
        reply = await chat(client, messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        if question:
            messages.append({"role": "user", "content": question})
    assert [m["content"] for m in messages if m["role"] == "assistant"] == ["Four.", "It is 5.", "Six"]
    [segment] = session.segments
    # ChatML puts "\n" after <|im_end|>; the generated ids end at <|im_end|>, so the delta must start with it
    assert tok.decode(segment.token_ids) + "\n" == render(tok, messages, generation_prompt=False)
    assert segment.token_ids + encode(tok, "\n") == encode(tok, render(tok, messages, generation_prompt=False))


async def test_a_turn_cut_by_length_is_closed_with_the_end_of_turn_token(serve, tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine(tok, ["one two three four five six seven", "ok"])
    server = await serve(engine, tok)
    session = server.open_session()
    client = serve.openai(server, session)
    first = await chat(client, [{"role": "user", "content": "count"}], max_tokens=3)
    assert first.choices[0].finish_reason == "length"
    messages = [
        {"role": "user", "content": "count"},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "stop"},
    ]
    await chat(client, messages)
    [segment] = session.segments
    assert segment.truncated and segment.finish_reasons == ["length", "stop"]
    assert tok.decode(segment.token_ids) == render(tok, messages) + "ok<|im_end|>"


async def test_several_new_messages_all_go_into_the_delta(serve, tiny_tokenizer):
    tok = tiny_tokenizer
    # two calls, written exactly as the tiny template renders them (so the final text check can be exact)
    calls = (
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "1+1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "2+2"}}\n</tool_call>'
    )
    engine = ScriptedEngine(tok, [calls, "Both are done."])
    server = await serve(engine, tok)
    session = server.open_session()
    client = serve.openai(server, session)
    messages = [{"role": "user", "content": "Compute 1+1 and 2+2."}]
    reply = await chat(client, messages, tools=[CALC_TOOL])
    message = reply.choices[0].message
    assert [c.function.arguments for c in message.tool_calls] == ['{"expr": "1+1"}', '{"expr": "2+2"}']
    messages.append(message.model_dump(exclude_none=True))
    messages += [
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "2"},
        {"role": "tool", "tool_call_id": message.tool_calls[1].id, "content": "4"},
    ]
    await chat(client, messages, tools=[CALC_TOOL])

    [segment] = session.segments
    first_prompt, _, first_gen = engine.calls[0]
    delta = engine.calls[1][0][len(first_prompt) + len(first_gen.token_ids) :]
    full = render(tok, messages, [CALC_TOOL])
    after_reply = full[len(render(tok, messages[:2], [CALC_TOOL], generation_prompt=False)) :]
    assert (
        "<tool_response>\n2\n</tool_response>" in after_reply and "<tool_response>\n4\n</tool_response>" in after_reply
    )
    assert tok.decode(delta) == "\n" + after_reply  # both results, after the "\n" that follows <|im_end|>
    messages.append({"role": "assistant", "content": "Both are done."})
    assert tok.decode(segment.token_ids) + "\n" == render(tok, messages, [CALC_TOOL], generation_prompt=False)


async def test_compaction_opens_a_new_segment_in_the_same_rollout(serve, tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine(tok, ["A.", "B.", "C.", "D."])
    server = await serve(engine, tok)
    session = server.open_session()
    client = serve.openai(server, session)
    messages = [{"role": "user", "content": "first"}]
    for question in ("second", None):
        reply = await chat(client, messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        if question:
            messages.append({"role": "user", "content": question})
    compacted = [{"role": "system", "content": "Summary: said A and B."}, {"role": "user", "content": "third"}]
    reply = await chat(client, compacted)
    await chat(
        client,
        compacted
        + [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "fourth"}],
    )
    first, second = session.segments
    assert len(first.action_ranges) == 2 and len(second.action_ranges) == 2
    assert first.rollout_id == second.rollout_id == session.rollout_id
    assert second.token_ids[: second.prompt_len] == encode(tok, render(tok, compacted))
    assert engine.calls[2][0] == encode(tok, render(tok, compacted))  # generated over the new segment only


async def test_a_reply_the_client_edited_is_a_rewrite_and_opens_a_new_segment(serve, tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine(tok, ["Four.", "Five."])
    server = await serve(engine, tok)
    session = server.open_session()
    client = serve.openai(server, session)
    await chat(client, [{"role": "user", "content": "2+2?"}])
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4, as I said."},
        {"role": "user", "content": "+1?"},
    ]
    await chat(client, messages)
    first, second = session.segments  # the model must see the edited reply, so the tokens start over
    assert second.token_ids[: second.prompt_len] == encode(tok, render(tok, messages))
    assert first.rollout_id == second.rollout_id


async def test_a_template_that_rewrites_history_opens_a_new_segment(serve, tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    # Qwen3-style: an assistant turn that is no longer the last message loses its <think> block
    tok.chat_template = tok.chat_template.replace(
        "<|im_start|>assistant\n{{ message.content or '' }}",
        "<|im_start|>assistant\n{{ (message.content or '') if loop.last else "
        "(message.content or '').split('</think>')[-1] }}",
    )
    engine = ScriptedEngine(tok, ["<think>2+2 is 4</think>Four.", "Five."])
    server = await serve(engine, tok)
    session = server.open_session()
    client = serve.openai(server, session)
    messages = [{"role": "user", "content": "2+2?"}]
    reply = await chat(client, messages)
    assert reply.choices[0].message.content == "<think>2+2 is 4</think>Four."
    messages += [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "+1?"}]
    await chat(client, messages)
    first, second = session.segments
    assert "<think>" in tok.decode(first.token_ids)
    assert second.token_ids[: second.prompt_len] == encode(tok, render(tok, messages))
    assert "<think>" not in tok.decode(second.token_ids)


async def test_a_retry_replays_the_reply_and_records_nothing(serve, tiny_engine, tiny_tokenizer):
    engine = RecordingEngine(tiny_engine)
    server = await serve(engine, tiny_tokenizer, params=SamplingParams(max_tokens=8))
    session = server.open_session()
    client = serve.openai(server, session)
    messages = [{"role": "user", "content": "Weng earns $12 an hour."}]
    first = await chat(client, messages, temperature=1.0)
    tokens = list(session.segments[0].token_ids)
    again = await chat(client, messages, temperature=1.0)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert len(engine.calls) == 1 and session.segments[0].token_ids == tokens
    assert session.replays == server.replays == 1  # counted: the rollout reports it as session/replays
    await chat(client, messages, temperature=0.5)  # a different request is a new generation
    assert len(engine.calls) == 2 and server.replays == 1
    server.close_session(session.session_id)
    assert server.replays == 1  # a closed session's replays stay counted


async def test_a_turn_is_committed_only_after_generation_succeeds(serve, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["fine"], fail_first=1)
    server = await serve(engine, tiny_tokenizer)
    session = server.open_session()
    with pytest.raises(openai.InternalServerError, match="scripted engine failure"):
        await chat(serve.openai(server, session, max_retries=0), [{"role": "user", "content": "hi"}])
    assert session.segments == []
    reply = await chat(serve.openai(server, session), [{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "fine"
    assert len(session.segments) == 1 and len(session.segments[0].action_ranges) == 1


async def test_no_room_left_answers_length_and_records_nothing(serve, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["x"])
    server = await serve(engine, tiny_tokenizer)
    session = server.open_session(max_length=5)
    reply = await chat(serve.openai(server, session), [{"role": "user", "content": "a long question " * 5}])
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content == ""
    assert session.segments == [] and engine.calls == []


async def test_fifty_concurrent_sessions_stay_isolated(serve, tiny_engine, tiny_tokenizer):
    tok = tiny_tokenizer
    server = await serve(tiny_engine, tok, params=SamplingParams(max_tokens=6))
    sessions = [server.open_session() for _ in range(50)]

    async def converse(i, session):
        client = serve.openai(server, session)
        messages = [{"role": "user", "content": f"Session {i} asks about {i} apples."}]
        reply = await chat(client, messages, seed=i)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"Session {i} again."},
        ]
        await chat(client, messages, seed=i)
        return messages

    conversations = await asyncio.gather(*[converse(i, s) for i, s in enumerate(sessions)])
    assert len({s.rollout_id for s in sessions}) == 50
    for i, (session, messages) in enumerate(zip(sessions, conversations, strict=True)):
        [segment] = session.segments
        assert segment.token_ids[: segment.prompt_len] == encode(tok, render(tok, messages[:1]))
        assert len(segment.action_ranges) == 2
        text = tok.decode(segment.token_ids)
        assert f"Session {i} again." in text
        assert all(f"Session {j} " not in text for j in range(50) if j != i)


async def test_replies_are_not_held_back_by_nagle_and_delayed_acks(serve, tiny_tokenizer):
    # a listening socket without IPPROTO_TCP gets no TCP_NODELAY from asyncio: every reply then waits ~40 ms
    server = await serve(ScriptedEngine(tiny_tokenizer, ["ok"]), tiny_tokenizer)
    async with httpx.AsyncClient(base_url=server.url) as http:
        await http.get("/health")
        latencies = []
        for _ in range(9):
            started = time.perf_counter()
            await http.get("/health")
            latencies.append(time.perf_counter() - started)
    assert sorted(latencies)[4] < 0.030, latencies


async def test_large_tokenizer_work_runs_off_the_event_loop(tiny_tokenizer):
    threads = []

    class Watched(ChatTemplate):
        def render(self, *args):
            threads.append(threading.current_thread().name)
            return super().render(*args)

    session = Session(
        ScriptedEngine(tiny_tokenizer, ["ok"]), Watched(tiny_tokenizer), params=SamplingParams(), max_length=100_000
    )
    threads.clear()  # the template's own probe render at construction
    await session.turn(ChatRequest([{"role": "user", "content": "short"}], None))
    assert threads == [threading.current_thread().name]  # under INLINE_MAX_CHARS: inline, no pool hop
    threads.clear()
    await session.turn(ChatRequest([{"role": "user", "content": "long " * INLINE_MAX_CHARS}], None))
    assert threads and all(name.startswith("molt-tokenize") for name in threads)


async def test_n_choices_are_batched_engine_calls_each_recorded_with_its_own_counts(serve, tiny_engine, tiny_tokenizer):
    """``n`` choices: one engine call each over the same prompt ids (concurrent: the engine batches them), choice i
    from seed + i;
    each choice carries its own usage and its own segment; the conversation continues from choice 0; a retry
    replays every choice."""
    engine = RecordingEngine(tiny_engine)
    server = await serve(engine, tiny_tokenizer, params=SamplingParams(max_tokens=12))
    session = server.open_session()
    client = serve.openai(server, session, max_retries=0)
    messages = [{"role": "user", "content": "Count the ducks."}]
    reply = await chat(client, messages, n=4, temperature=1.0, seed=11, max_tokens=12)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert len(engine.calls) == 4 and len({tuple(p) for p, _, _ in engine.calls}) == 1
    assert sorted(params.seed for _, params, _ in engine.calls) == [11, 12, 13, 14]
    gens = {params.seed - 11: gen for _, params, gen in engine.calls}
    texts = [c.message.content for c in reply.choices]
    assert len(set(texts)) > 1  # four seeds at temperature 1 on a random tiny model
    per_choice = [c.model_extra["usage"] for c in reply.choices]
    for i, usage in enumerate(per_choice):
        assert usage["completion_tokens"] == len(gens[i].token_ids)
        assert usage["prompt_tokens"] == len(engine.calls[0][0])
    assert reply.usage.completion_tokens == sum(u["completion_tokens"] for u in per_choice)
    assert reply.usage.prompt_tokens == len(engine.calls[0][0])
    assert len(session.segments) == 4  # choices 1..3, then choice 0 (the conversation goes on from it)
    for segment, i in zip(session.segments, [1, 2, 3, 0], strict=True):
        start, end = segment.action_ranges[0]
        assert segment.token_ids[start:end] == gens[i].token_ids and segment.log_probs[start:end] == gens[i].log_probs

    again = await chat(client, messages, n=4, temperature=1.0, seed=11, max_tokens=12)  # a retry: replayed
    assert [c.message.content for c in again.choices] == texts and len(engine.calls) == 4

    follow = [*messages, {"role": "assistant", "content": texts[0]}, {"role": "user", "content": "And now?"}]
    one = await chat(client, follow, max_tokens=4)
    assert "usage" not in (one.choices[0].model_extra or {})  # n=1: the standard reply
    assert len(session.segments) == 4 and session.segments[-1].num_turns == 2  # continued choice 0's segment


async def test_n_choices_stream_each_with_its_index(serve, tiny_engine, tiny_tokenizer):
    server = await serve(tiny_engine, tiny_tokenizer, params=SamplingParams(max_tokens=6))
    session = server.open_session()
    client = serve.openai(server, session)
    stream = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], n=3, seed=5, temperature=1.0,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    text, finished, usage = {0: "", 1: "", 2: ""}, set(), None
    async for chunk in stream:
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
        usage = chunk.usage or usage
    assert finished == {0, 1, 2} and len(session.segments) == 3
    whole = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], n=3, seed=5, temperature=1.0
    )  # the same request unstreamed: a replay of the same choices
    assert [c.message.content for c in whole.choices] == [text[0], text[1], text[2]]
    assert usage.completion_tokens == whole.usage.completion_tokens
