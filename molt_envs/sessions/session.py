"""Chat sessions with token-exact capture: what the session server records for one rollout.

A ``Session`` turns each chat request into one engine call over the **exact** token ids the model has seen so far:

- The first request (and any request that does not extend the last one) renders the whole conversation with the chat
  template and opens a new segment (a ``Trajectory``) with those ids as its prompt.
- A request that extends the last one (same messages, then the assistant's reply, then one *or more* new messages)
  tokenizes only the template delta: the text after the assistant's turn, plus whatever template text follows the
  end-of-turn token (ChatML's ``"\\n"`` after ``<|im_end|>``), which the generated ids do not contain. The generated
  ids stay exactly as the engine produced them; the client's copy of the reply is only compared as rendered text.
- A request that rewrites the prefix (agent-side compaction, an edited reply), changes the tools, or whose rendering
  rewrites history (a template that drops earlier ``<think>`` blocks) seals the current segment and opens a new one.
  Segments share ``rollout_id``.

Retries are safe: a request identical to the last one gets the cached reply and records nothing; a turn is committed
only after generation succeeded; one lock per session serializes turns.

Images (a vision model's server, whose ``tokenizer`` is the model's processor): the wires decode image parts into
``{"type": "image", "image": <base64>}`` message parts; the plan decodes them under the size limits
(``molt_envs.vision``) and the processor encodes the new piece of context with its images, so a segment's ids hold
the expanded placeholders and its ``mm_inputs`` the image tensors aligned with them, exactly as the engine saw them.
A bad image or more images than the model's limit is a 400.

Template rendering and tokenization run on the tokenizer pool (``runners.off_loop``), off the event loop, except
for small pieces of work (a request under ``INLINE_MAX_CHARS`` of JSON, a completion under a quarter of that in
tokens), which run inline: a hop to the pool costs more than such work and, measured at 100 concurrent sessions
(benchmarks/README.md), took the p99 handler time from about 1 ms to over 150 ms.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from molt_envs.contract import SamplingParams
from molt_envs.engine import Engine
from molt_envs.runners import INLINE_MAX_CHARS, off_loop
from molt_envs.tool_calls import ToolCall, parse_tool_calls
from molt_envs.trajectory import Trajectory
from molt_envs.vision import ImageError, VisionInputs, load_image, text_tokenizer, vision_codec

_PROBE = "\x00molt-probe\x00"


class BadRequest(ValueError):
    """The request is wrong (the server answers 4xx with this message); never an engine or server fault."""


class SessionClosed(LookupError):
    """The session was closed (or expired) while this call waited or generated: nothing of it is recorded."""


@dataclass
class ChatRequest:
    """One chat call, decoded from either wire into the OpenAI message shape the chat template renders."""

    messages: list[dict[str, Any]]  # {"role", "content": str} (+ "tool_calls" / "tool_call_id")
    tools: list[dict[str, Any]] | None  # OpenAI function tools
    overrides: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields set by this request
    parse_tools: bool = True  # False when the caller asked for no tool use (tool_choice "none")
    n: int = 1  # choices to sample (the OpenAI wire's ``n``), each from its own seed

    def key(self) -> str:
        """The request's identity: an identical request after it is a client's retry, answered by replay."""
        return json.dumps(
            [self.messages, self.tools, self.overrides, self.parse_tools, self.n], sort_keys=True, default=str
        )


@dataclass
class WireCall:
    """A request as one wire decoded it: the ``ChatRequest`` and what that wire needs to answer it."""

    request: ChatRequest
    stream: bool = False
    options: dict[str, Any] = field(default_factory=dict)  # wire-specific (include_usage, Responses echo fields)


@dataclass
class Reply:
    """The model's answer to one request, wire-neutral."""

    text: str  # the completion as generated (special tokens kept, the final stop token dropped)
    content: str  # ``text`` minus well-formed tool-call blocks
    tool_calls: list[ToolCall]
    finish_reason: str  # "stop" | "length" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    engine_s: float = 0.0  # seconds spent inside engine.generate (the rest of a call is server overhead)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)  # kept by a replay: a retry gets the same ids


class ChatTemplate:
    """The tokenizer's chat template and codec, with what it renders after an assistant's end-of-turn token.

    ``tokenizer`` may be a vision model's processor: ``codec`` then encodes pieces of context holding images.

    Args:
        tokenizer: a transformers tokenizer with a ``chat_template``, or a vision model's processor.

    Raises:
        ValueError: if it has no chat template, or one that does not render an assistant's content verbatim.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.codec = vision_codec(tokenizer)
        tokenizer = text_tokenizer(tokenizer)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no chat_template; the session server renders "
                "every request through it. Set tokenizer.chat_template."
            )
        self.tokenizer = tokenizer
        probe = self.render([{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE}], None, False)
        if _PROBE not in probe:
            raise ValueError(
                "the chat template does not render an assistant message's content verbatim; "
                "token-exact continuation needs it to"
            )
        self.turn_end = probe[probe.index(_PROBE) + len(_PROBE) :]  # ChatML: "<|im_end|>\n"
        # whether the template renders an assistant message's reasoning_content (Qwen3's <think> block): where
        # it does, reasoning items and thinking blocks from the client are passed to it; elsewhere they are dropped
        thought = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a", "reasoning_content": _PROBE}]
        self.renders_reasoning = _PROBE in self.render(thought, None, False)

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation_prompt: bool
    ) -> str:
        """The conversation as the template renders it.

        Args:
            messages: OpenAI-shaped chat messages.
            tools: OpenAI function tools, or None.
            generation_prompt: end with the assistant turn's opening (what the model continues from).

        Returns:
            The rendered text.

        Raises:
            BadRequest: if the template refuses the conversation (its ``raise_exception``).
        """
        from jinja2 import TemplateError  # what transformers renders chat templates with

        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
            )
        except TemplateError as exc:  # e.g. a template's raise_exception on the conversation's shape
            raise BadRequest(f"the chat template refused the conversation: {exc}") from None

    def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
        """Tokens of the conversation as the model would see it (rendered with the generation prompt, images expanded).

        Args:
            messages, tools: as for ``render``.

        Returns:
            The token count.

        Raises:
            BadRequest: as ``render``, or a bad image (``encode_images``).
        """
        return len(self.encode_images(self.render(messages, tools, True), images_of(messages), 0)[0])

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_images(self, text: str, images: list[Any], seen: int) -> tuple[list[int], VisionInputs | None]:
        """``text``'s ids with its images' placeholders expanded, and their tensors; ``seen``: images already in the
        context. Raises ``BadRequest`` for an undecodable or oversized image, or more than the model's limit."""
        if not images:
            return self.encode(text), None
        try:
            if seen + len(images) > self.codec.max_images:
                raise ImageError(
                    f"the conversation holds {seen + len(images)} images; the model's limit is {self.codec.max_images}"
                )
            decoded = [load_image(image, f"image {seen + k}") for k, image in enumerate(images)]
            return self.codec.encode(text, decoded)
        except ImageError as exc:
            raise BadRequest(str(exc)) from None

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens kept."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def closing(self, stop_text: str | None) -> str:
        """Template text that follows an assistant turn and is not in its generated ids.

        Args:
            stop_text: the stop token that ended the turn, decoded; None if the turn was cut off by length.

        Returns:
            What the template renders after that token (all of its turn end when none ended the turn).
        """
        if stop_text and stop_text in self.turn_end:
            return self.turn_end[self.turn_end.index(stop_text) + len(stop_text) :]
        return self.turn_end  # cut off by length (or an unknown stop token): close the turn as the template does


@dataclass
class _Plan:
    new_segment: bool
    ids: list[int]  # the whole prompt (new segment) or the delta to append (continuation)
    rendered: str  # the full rendering of the request, with the generation prompt
    mm: VisionInputs | None = None  # the images of ``ids``


class Session:
    """One rollout's conversation with the policy; ``segments`` are its token-exact trajectories.

    A request that extends the last one (same tools, the previous reply as sent, new messages after it) continues
    the current segment; any other starts a new segment. An identical repeat of the last request is a retry: it gets
    the last reply again and records nothing.

    Args:
        engine: the policy's engine.
        template: the tokenizer's ``ChatTemplate``.
        params: the session's sampling parameters (requests may override some).
        max_length: token budget of a segment (prompt and generations).
        session_id: its id (default: a random one).
        prompt, label: recorded on every segment.

    Raises:
        ValueError: if ``max_length`` is not positive.
    """

    def __init__(
        self,
        engine: Engine,
        template: ChatTemplate,
        *,
        params: SamplingParams,
        max_length: int,
        session_id: str | None = None,
        prompt: Any = None,
        label: Any = None,
    ) -> None:
        if max_length <= 0:
            raise ValueError(f"max_length must be positive, got {max_length}")
        self.engine = engine
        self.template = template
        self.params = params
        self.max_length = max_length
        self.session_id = session_id or uuid.uuid4().hex
        self.rollout_id = uuid.uuid4().hex
        self.api_key = secrets.token_urlsafe(24)  # what a client must send on the server's unix socket
        self.prompt, self.label = prompt, label
        self.segments: list[Trajectory] = []
        self.refused = 0  # calls answered with an empty "length" reply: no room left under max_length
        self.replays = 0  # a client's retries answered by replaying the last call (its connection broke, say)
        self.inline_max_chars = INLINE_MAX_CHARS  # -1: every piece of tokenizer work goes to the pool
        self.lock = asyncio.Lock()
        self.last_used = time.monotonic()
        self.closed = False  # set by the server on close: a call in flight then records nothing
        self.responses: dict[str, Any] = {}  # the Responses wire's stored responses (wire_responses.Stored)
        self._history: list[dict[str, Any]] | None = None  # the last committed request's messages
        self._tools: list[dict[str, Any]] | None = None
        self._seen: str = ""  # its rendering, which the current segment's ids encode
        self._stop_text: str | None = None  # the stop token that ended the last action, if one did
        self._last_key: str | None = None
        self._last_replies: list[Reply] = []  # the last call's choices (a retry replays them)

    async def turn(self, request: ChatRequest) -> Reply:
        """Generate the reply to one request and record it (calls of one session run one at a time).

        Args:
            request: the decoded request (``n`` 1; ``turn_choices`` samples several).

        Returns:
            The reply; an empty ``"length"`` reply when the budget has no room left (nothing is generated then).

        Raises:
            BadRequest: for an empty conversation, bad sampling overrides, a template refusal or untokenizable text.
            SessionClosed: if the session was closed while this call generated (nothing is recorded).
        """
        return (await self.turn_choices(request))[0]

    async def turn_choices(self, request: ChatRequest) -> list[Reply]:
        """Generate ``request.n`` replies to one request (the OpenAI wire's ``n``) and record each.

        The choices are ``n`` concurrent ``Engine.generate`` calls over the same prompt ids, which the engine
        batches (the hf engine prefills the shared prompt once). Choice ``i`` samples with seed ``seed + i`` when
        the request has a seed. With ``n`` > 1 each choice is recorded as a segment of its own (a copy of the
        segment the request continues, extended by that choice); choice 0's segment comes last, and the
        conversation continues from choice 0.

        Args:
            request: the decoded request.

        Returns:
            The replies, in choice order; one empty ``"length"`` reply per choice when the budget has no room left.

        Raises:
            BadRequest: as ``turn``.
            SessionClosed: as ``turn``.
        """
        if not request.messages:
            raise BadRequest("messages is empty; send at least one message")
        if not isinstance(request.n, int) or request.n < 1:
            raise BadRequest(f"n must be a positive integer, got {request.n!r}")
        try:
            params = self.params.updated(**request.overrides)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        key = request.key()
        self.last_used = time.monotonic()
        async with self.lock:
            if key == self._last_key and self._last_replies:
                self.replays += 1
                return [replace(r, engine_s=0.0) for r in self._last_replies]  # a retry: replay, record nothing
            try:
                plan = await self._tokenizer_work(len(key), self._plan, request)
            except (TypeError, UnicodeEncodeError) as exc:  # what tokenizers raise on text they cannot encode
                try:  # the client's fault only if its text has an unpaired surrogate (an escape such as \\ud800)
                    json.dumps([request.messages, request.tools], ensure_ascii=False).encode()
                except UnicodeEncodeError:
                    raise BadRequest(
                        f"the conversation cannot be tokenized ({type(exc).__name__}: {exc}): a message "
                        "holds an unpaired surrogate escape such as \\ud800"
                    ) from None
                raise
            context = len(plan.ids) + (0 if plan.new_segment else len(self.segments[-1].token_ids))
            budget = min(params.max_tokens, self.max_length - context)
            if budget <= 0:  # no room left: nothing is generated or recorded
                self.refused += 1
                if not plan.new_segment:
                    self.segments[-1].truncated = True
                return [Reply("", "", [], "length", context, 0) for _ in range(request.n)]
            prompt_ids = plan.ids if plan.new_segment else self.segments[-1].token_ids + plan.ids
            mm = (
                plan.mm
                if plan.new_segment or self.segments[-1].mm_inputs is None
                else self.segments[-1].mm_inputs + plan.mm
            )
            base = params.updated(max_tokens=budget)
            choices = [
                base if i == 0 or base.seed is None else base.updated(seed=(base.seed + i) % 2**63)
                for i in range(request.n)
            ]
            started = time.perf_counter()
            gens = await asyncio.gather(*(self.engine.generate(prompt_ids, p, mm) for p in choices))
            engine_s = time.perf_counter() - started
            replies, stops = [], []
            for gen in gens:
                if len(gen.token_ids) != len(gen.log_probs):
                    raise RuntimeError(
                        f"engine returned {len(gen.token_ids)} tokens but {len(gen.log_probs)} log-probs"
                    )
                stopped = gen.finish_reason == "stop" and bool(gen.token_ids)
                text_ids = gen.token_ids[:-1] if stopped else gen.token_ids
                text, stop_text = await self._tokenizer_work(
                    4 * len(text_ids), _decode_action, self.template, text_ids, gen.token_ids[-1] if stopped else None
                )
                content, calls = parse_tool_calls(text) if request.tools and request.parse_tools else (text, [])
                finish = "length" if gen.finish_reason == "length" else "tool_calls" if calls else "stop"
                replies.append(Reply(text, content, calls, finish, len(prompt_ids), len(gen.token_ids), engine_s))
                stops.append(stop_text)
            if self.closed:  # the trajectory was handed over meanwhile: it must not change any more
                raise SessionClosed(
                    f"session {self.session_id} was closed while this call generated; nothing was recorded"
                )
            self._commit(request, plan, gens, stops, mm)
            self._last_key, self._last_replies = key, replies
            self.last_used = time.monotonic()
            return replies

    async def _tokenizer_work(self, size: int, fn: Any, *args: Any) -> Any:
        return fn(*args) if size <= self.inline_max_chars else await off_loop(fn, *args)

    def _plan(self, request: ChatRequest) -> _Plan:
        """Decide continuation vs new segment and tokenize what is new (usually on the tokenizer pool)."""
        messages, tools = request.messages, request.tools
        full = self.template.render(messages, tools, True)
        history = self._history
        if history is not None and tools == self._tools and _extends(history, messages, self._last_reply):
            prefix = self.template.render(messages[: len(history) + 1], tools, False)
            if full.startswith(prefix) and prefix.startswith(self._seen) and prefix.endswith(self.template.turn_end):
                delta = self.template.closing(self._stop_text) + full[len(prefix) :]
                seen = len(self.segments[-1].images)
                ids, mm = self.template.encode_images(delta, images_of(messages[len(history) + 1 :]), seen)
                return _Plan(False, ids, full, mm)
        ids, mm = self.template.encode_images(full, images_of(messages), 0)
        return _Plan(True, ids, full, mm)

    def _commit(
        self, request: ChatRequest, plan: _Plan, gens: list[Any], stops: list[str | None], mm: VisionInputs | None
    ) -> None:
        """Record each choice's action: choice 0 on the segment the request opens or continues, any other choice on
        a copy of that segment (before it: the conversation goes on from choice 0's segment, the last one)."""
        if plan.new_segment:
            segment = Trajectory(rollout_id=self.rollout_id, prompt=self.prompt, label=self.label)
            segment.append_observation(plan.ids)
            segment.prompt_len = len(plan.ids)
        else:
            segment = self.segments.pop()
            segment.append_observation(plan.ids)
        branches = [  # copies whose lists are their own
            replace(
                segment,
                token_ids=list(segment.token_ids),
                action_ranges=list(segment.action_ranges),
                log_probs=list(segment.log_probs),
                finish_reasons=list(segment.finish_reasons),
                info=dict(segment.info),
                images=list(segment.images),
            )
            for _ in gens[1:]
        ]
        for seg, gen in zip([*branches, segment], [*gens[1:], gens[0]], strict=True):
            seg.append_action(list(gen.token_ids), list(gen.log_probs), gen.finish_reason)
            if mm is not None:
                seg.mm_inputs, seg.images = mm, list(mm.images)
            seg.truncated |= gen.finish_reason == "length"
            seg.num_turns += 1
        self.segments += [*branches, segment]
        self._history, self._tools = list(request.messages), request.tools
        self._seen, self._stop_text = plan.rendered, stops[0]

    @property
    def _last_reply(self) -> Reply | None:
        """The reply the conversation continues from (choice 0 of the last call)."""
        return self._last_replies[0] if self._last_replies else None


def images_of(messages: list[dict[str, Any]]) -> list[Any]:
    """The (still encoded) images of the messages' image parts, in order."""
    return [
        part["image"]
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if part.get("type") == "image"
    ]


def _extends(history: list[dict[str, Any]], messages: list[dict[str, Any]], reply: Reply | None) -> bool:
    """The request repeats the last one, then the assistant's reply as given, then at least one new message.

    A reply the client edited (other text, other calls) is a rewrite: the model must see the client's version.
    """
    n = len(history)
    if not (len(messages) > n + 1 and messages[:n] == history and reply is not None):
        return False
    echoed = messages[n]
    calls = [(c["function"]["name"], _arguments(c["function"]["arguments"])) for c in echoed.get("tool_calls") or []]
    return (
        echoed.get("role") == "assistant"
        and echoed.get("content", "") == reply.content
        and calls == [(c.name, c.arguments) for c in reply.tool_calls]
    )


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _decode_action(template: ChatTemplate, text_ids: list[int], stop_id: int | None) -> tuple[str, str | None]:
    return template.decode(text_ids), (template.decode([stop_id]) if stop_id is not None else None)


def segment_json(segment: Trajectory) -> dict[str, Any]:
    """The wire form of one segment (what ``GET /sessions/{id}/trajectory`` returns).

    Args:
        segment: a session's segment.

    Returns:
        Its token ids, action ranges, log-probs, finish reasons, prompt length, truncation, turns and rollout id.
    """
    return {
        "token_ids": segment.token_ids,
        "action_ranges": [list(r) for r in segment.action_ranges],
        "log_probs": segment.log_probs,
        "finish_reasons": segment.finish_reasons,
        "prompt_len": segment.prompt_len,
        "truncated": segment.truncated,
        "num_turns": segment.num_turns,
        "rollout_id": segment.rollout_id,
        "num_images": len(segment.images),
    }
