"""Runners turn one prompt into one rollout through an ``Engine``.

``StepEnvRunner`` drives an ``Env``: generate over the exact accumulated token ids, hand the decoded action to
``env.step``, append the env's observation as masked tokens, repeat until the env terminates, truncates, or the
context budget runs out. A failure anywhere in the episode ends that episode with ``Trajectory.failure`` set; it
never propagates out of ``execute``.

Images (the row's, those ``reset`` returns, and each ``Result.images``) need a vision model: ``tokenizer`` is then
its processor (``molt_envs.vision``). The context holding them is rendered by the chat template with an image part
per image and encoded by the processor, which expands each placeholder into the exact ids the model reads; the
image tensors accumulate on ``Trajectory.mm_inputs`` in placeholder order. A text-only episode never touches any of
it. An image the episode cannot use (corrupt, too large, too many, a text-only model) fails the episode as
``images: ...``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from molt_envs.contract import Env, Result, SamplingParams
from molt_envs.engine import Engine
from molt_envs.judge import JudgeClient
from molt_envs.trajectory import Trajectory
from molt_envs.vision import (
    ImageError,
    VisionInputs,
    image_digest,
    load_image,
    place_images,
    require_codec,
    text_tokenizer,
    vision_codec,
)

# Tokenizers run off the event loop on their own pool, so a busy default executor can never starve them.
_TOKENIZE_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="molt-tokenize")
INLINE_MAX_CHARS = 4096  # below this text size, tokenizing takes well under a millisecond: cheaper than a pool hop
PROMPT_CACHE_SIZE = 4096  # rendered + tokenized prompts a StepEnvRunner keeps (a GRPO group repeats its prompt)


async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_TOKENIZE_POOL, fn, *args)


async def tokenizer_work(size: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` inline when ``size`` (characters of work) is under ``INLINE_MAX_CHARS``, else on the pool."""
    return fn(*args) if size <= INLINE_MAX_CHARS else await off_loop(fn, *args)


def render_prompt(tokenizer: Any, prompt: str | list[dict[str, Any]], tools: list[dict] | None = None) -> str:
    """A message list goes through the model's chat template; a string is taken as already rendered.

    Args:
        tokenizer: anything with ``apply_chat_template`` (a transformers tokenizer).
        prompt: rendered text, or chat messages.
        tools: OpenAI function schemas for the template.

    Returns:
        The text the model sees, generation prompt included.

    Raises:
        TypeError: if ``prompt`` is neither a str nor a list.
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=False)
    raise TypeError(f"prompt must be a str or a list of chat messages, got {type(prompt).__name__}")


_PROBE_TEXT = "\x00molt-probe\x00"
_PROBE = [{"role": "user", "content": _PROBE_TEXT}, {"role": "assistant", "content": _PROBE_TEXT}]


def render_turn(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None, action_text: str) -> str:
    """The text of the turn that follows the model's action, as the model's chat template writes it.

    The template is rendered around a probe conversation: what it writes after an assistant message (e.g.
    ``<|im_end|>\n``) closes the action (minus the end-of-turn token when the model generated it itself), then the
    new ``messages`` and the generation prompt follow. Raises ``ValueError`` for a template whose rendering of a
    conversation is not a prefix of its rendering of a longer one.
    """
    before = tokenizer.apply_chat_template(_PROBE, tools=tools, tokenize=False)
    after = tokenizer.apply_chat_template(_PROBE + messages, tools=tools, add_generation_prompt=True, tokenize=False)
    if not after.startswith(before):
        raise ValueError(
            "this chat template rewrites earlier turns when a turn is added, so observation messages "
            "cannot be appended token-exactly; return the next turn as text (a str) instead"
        )
    closing = before[before.rindex(_PROBE_TEXT) + len(_PROBE_TEXT) :]  # what the template writes after an action
    eos = tokenizer.eos_token or ""
    if eos and closing.startswith(eos) and action_text.endswith(eos):
        closing = closing[len(eos) :]
    return closing + after[len(before) :]


class Runner(ABC):
    """Runs one rollout. ``AgentRunner`` in an agent file (``--train.agent_path``) subclasses this.

    Attributes:
        env_id, spec_hash: stamped on every trajectory it returns.
        judge: the ``JudgeClient`` every episode gets (``StepState["judge"]``, ``ChatContext.judge``), or None; set
            by whoever runs it (the trainer's ``--judge.*``, an evaluator's judge endpoint).
    """

    env_id: str | None = None
    spec_hash: str | None = None
    judge: JudgeClient | None = None

    @abstractmethod
    async def execute(
        self,
        prompt: str | list[dict[str, Any]],
        label: Any,
        sampling_params: SamplingParams,
        max_length: int,
        tokenizer: Any,
        engine: Engine,
        images: list[Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Trajectory | list[Trajectory]:
        """Run one rollout of ``prompt`` through ``engine``.

        Args:
            prompt: rendered text or chat messages. label: the row's label, for grading.
            sampling_params: the run's params. max_length: the token budget of the whole context.
            tokenizer: the policy's tokenizer. engine: the ``Engine`` to generate through.
            images: the row's images. tools: OpenAI function schemas for the chat template.

        Returns:
            The trajectory, or a chat rollout's segments. Never raises for the episode's failures: they are
            recorded in ``Trajectory.failure``.
        """

    async def run_row(
        self, row: dict[str, Any], sampling_params: SamplingParams, max_length: int, tokenizer: Any, engine: Engine
    ) -> Trajectory | list[Trajectory]:
        """``execute`` on one dataset row (``prompt``, ``label`` and, when it has any, ``images``): what every host
        that runs rows calls (the trainer's rollout worker, the registry's eval), so no host drops a field. A
        text-only runner's ``execute`` need not take ``images``: they are passed only when the row has some."""
        images = {"images": row["images"]} if row.get("images") else {}
        return await self.execute(row["prompt"], row["label"], sampling_params, max_length, tokenizer, engine, **images)

    def _new_trajectory(self, prompt: Any, label: Any, images: list[Any] | None) -> Trajectory:
        return Trajectory(
            prompt=prompt, label=label, images=list(images or []), env_id=self.env_id, spec_hash=self.spec_hash
        )


class StepEnvRunner(Runner):
    """The framework-owned loop over an ``Env``; ``env_factory`` is called once per episode.

    Args:
        env_factory: makes a fresh ``Env`` (a class, or ``lambda: make(id)``).
        env_id, spec_hash: stamped on every trajectory.
        max_turns: turns after which a still-running episode is truncated (None: no limit).
    """

    def __init__(
        self,
        env_factory: Callable[[], Env],
        *,
        env_id: str | None = None,
        spec_hash: str | None = None,
        max_turns: int | None = None,
    ) -> None:
        self.env_factory = env_factory
        self.env_id = env_id
        self.spec_hash = spec_hash
        self.max_turns = max_turns
        # JSON (images as digests) -> (tokenizer, text, ids, image inputs)
        self._prompts: OrderedDict[str, tuple[Any, str, list[int], VisionInputs | None]] = OrderedDict()

    async def execute(self, prompt, label, sampling_params, max_length, tokenizer, engine, images=None, tools=None):
        traj = self._new_trajectory(prompt, label, images)
        stage = ["make"]  # where the episode is, for the failure reason
        env = None
        try:
            env = self.env_factory()
            if not isinstance(env, Env):
                raise TypeError(f"env factory returned {type(env).__name__}, which is not a molt_envs.Env")
            stage[0] = "reset"
            start = await env.reset({"observation": prompt, "label": label, "images": list(images or [])})
            stage[0] = "tokenize"
            context, prompt_ids, mm = await self._render(
                tokenizer, start["observation"], start.get("tools", tools), list(start.get("images", images) or [])
            )
            traj.images, traj.mm_inputs = (list(mm.images), mm) if mm else ([], None)
            if len(prompt_ids) >= max_length:
                raise ValueError(
                    f"prompt is {len(prompt_ids)} tokens, which leaves no room under max_length={max_length}"
                )
            traj.append_observation(prompt_ids)
            traj.prompt_len = len(prompt_ids)
            await self._loop(
                env,
                traj,
                context,
                label,
                SamplingParams.coerce(sampling_params),
                max_length,
                tokenizer,
                engine,
                stage,
                start.get("tools", tools),
            )
        except Exception as exc:  # failure isolation: the episode ends, the reason is recorded, nothing propagates
            traj.failure = failure_reason("images" if isinstance(exc, ImageError) else stage[0], exc)
        finally:
            if env is not None:
                try:
                    await env.close()
                except Exception as exc:
                    traj.failure = traj.failure or failure_reason("close", exc)
        return traj

    async def _render(
        self, tokenizer: Any, observation: Any, tools: list[dict] | None, images: list[Any]
    ) -> tuple[str, list[int], VisionInputs | None]:
        """The first observation rendered and tokenized (a vision model's processor expanding its images), from the
        LRU cache when this tokenizer has seen it (the samples of a group share their prompt; rendering a chat
        template costs ~0.2 ms, processing an image more)."""
        images = [load_image(image, f"image {k}") for k, image in enumerate(images)]
        try:
            key = json.dumps([observation, tools, images], sort_keys=True, default=_image_key)
        except (TypeError, ValueError):  # not JSON: rendered every time
            key = None
        hit = self._prompts.get(key) if key is not None else None
        if hit is not None and hit[0] is tokenizer:
            self._prompts.move_to_end(key)
            return hit[1], list(hit[2]), hit[3]
        text_tok = text_tokenizer(tokenizer)
        if images or _holds_images(observation):
            if isinstance(observation, list):
                observation, images = place_images(observation, images)
            images = [load_image(image, f"image {k}") for k, image in enumerate(images)]
            codec = require_codec(tokenizer, len(images))
            context = render_prompt(text_tok, observation, tools)
            ids, mm = await off_loop(codec.encode, context, images)
        else:
            context, mm = render_prompt(text_tok, observation, tools), None
            ids = await tokenizer_work(len(context), _encode, text_tok, context)
        if key is not None:
            self._prompts[key] = (tokenizer, context, list(ids), mm)
            if len(self._prompts) > PROMPT_CACHE_SIZE:
                self._prompts.popitem(last=False)
        return context, ids, mm

    async def _loop(self, env, traj, context, label, params, max_length, tokenizer, engine, stage, tools) -> None:
        reward = 0.0
        turn = 0
        text_tok = text_tokenizer(tokenizer)
        while True:
            budget = min(params.max_tokens, max_length - len(traj.token_ids))
            if budget <= 0:
                traj.truncated = True
                break
            stage[0] = "generate"
            gen = await engine.generate(list(traj.token_ids), params.updated(max_tokens=budget), traj.mm_inputs)
            traj.append_action(gen.token_ids, gen.log_probs, gen.finish_reason)
            traj.truncated |= gen.finish_reason == "length"
            action_text = await tokenizer_work(4 * len(gen.token_ids), _decode, text_tok, gen.token_ids)
            context += action_text
            stage[0] = "step"
            result = await env.step(
                {
                    "observation_text": context,
                    "action_text": action_text,
                    "label": label,
                    "sampling_params": params.updated(),
                    "turn": turn,
                    "images": list(traj.images),
                    "judge": self.judge,
                }
            )
            if not isinstance(result, Result):
                raise TypeError(f"Env.step must return a molt_envs.Result, got {type(result).__name__}")
            turn += 1
            reward += result.reward
            traj.score, traj.info = result.score, dict(result.info)
            traj.truncated |= result.truncated
            if result.observation or result.images:
                stage[0] = "tokenize"
                text, obs_ids, mm = await self._observation(result, tokenizer, tools, action_text, len(traj.images))
                room = max_length - len(traj.token_ids)
                if len(obs_ids) > room:
                    if mm is not None:  # images cut off would misalign their tensors: the turn ends before them
                        room = min(room, obs_ids.index(vision_codec(tokenizer).image_token_id))
                        mm = None
                    obs_ids, traj.truncated = obs_ids[:room], True
                traj.append_observation(obs_ids)
                if mm is not None:
                    traj.mm_inputs = mm if traj.mm_inputs is None else traj.mm_inputs + mm
                    traj.images.extend(mm.images)
                context += text
            params = SamplingParams.coerce(result.sampling_params, params)
            if self.max_turns is not None and turn >= self.max_turns and not result.terminated:
                traj.truncated = True
            if result.terminated or traj.truncated:
                break
        traj.reward = reward
        traj.num_turns = turn
        if traj.score is None:
            traj.score = reward

    async def _observation(
        self, result: Result, tokenizer: Any, tools: list[dict] | None, action_text: str, seen: int
    ) -> tuple[str, list[int], VisionInputs | None]:
        """The next turn's text and ids (after the model's action), and what the processor made of its images."""
        text_tok = text_tokenizer(tokenizer)
        observation, images = result.observation, list(result.images or [])
        if not images and not _holds_images(observation):
            text = (
                render_turn(text_tok, observation, tools, action_text) if isinstance(observation, list) else observation
            )
            return text, await tokenizer_work(len(text), _encode, text_tok, text), None
        if isinstance(observation, list):
            observation, images = place_images(observation, images)
        images = [load_image(image, f"Result.images[{k}]") for k, image in enumerate(images)]
        codec = require_codec(tokenizer, seen + len(images))
        text = render_turn(text_tok, observation, tools, action_text) if isinstance(observation, list) else observation
        ids, mm = await off_loop(codec.encode, text, images)
        return text, ids, mm


def _holds_images(observation: Any) -> bool:
    """Whether chat messages carry image parts."""
    return isinstance(observation, list) and any(
        isinstance(p, dict) and p.get("type") == "image"
        for m in observation
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for p in m["content"]
    )


def _image_key(value: Any) -> str:
    """How an image enters a cache key: its content digest (``json.dumps`` default)."""
    if hasattr(value, "tobytes") and hasattr(value, "mode"):
        return image_digest(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def failure_reason(stage: str, exc: BaseException) -> str:
    """``Trajectory.failure``: ``"<stage>: <Exception>: <message>"``; an exception's own ``failure_stage`` (the env
    protocol's wire failures) names the stage instead of where the episode was."""
    return f"{getattr(exc, 'failure_stage', None) or stage}: {type(exc).__name__}: {exc}"


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def load_agent_runner(path: str | Path) -> Runner:
    """Load ``AgentRunner`` from a ``.py`` file (the seed's ``--train.agent_path`` contract).

    Args:
        path: the agent file.

    Returns:
        A new ``AgentRunner()``.

    Raises:
        FileNotFoundError: if ``path`` is not an existing ``.py`` file.
        TypeError: if it defines no ``AgentRunner`` subclass of ``Runner``.
    """
    path = Path(path)
    if path.suffix != ".py" or not path.is_file():
        raise FileNotFoundError(f"agent path {str(path)!r} must be an existing .py file that exports AgentRunner")
    spec = importlib.util.spec_from_file_location("agent_module", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["agent_module"] = module
    spec.loader.exec_module(module)
    runner_cls = getattr(module, "AgentRunner", None)
    if not (isinstance(runner_cls, type) and issubclass(runner_cls, Runner)):
        raise TypeError(
            f"{path} must define `AgentRunner`, a subclass of molt_envs.Runner (StepEnvRunner or ChatAgentRunner)"
        )
    return runner_cls()
