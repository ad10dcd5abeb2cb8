"""``EnginePolicy``: an in-process ``Engine`` (the trainer's hf or vLLM engine) driven by the token-level runners.

``Env`` IDs go through ``StepEnvRunner`` (raw-text and message observations alike), ``ChatAgent`` IDs through
``ChatAgentRunner`` and its embedded session server, ``game`` IDs through ``SeatRunner`` (a sample's reward is the
mean over the seats the model played; ``info["seat_rewards"]`` holds each) — the runners ``runner_for`` picks. This is what ``molt-train eval`` and the trainer's periodic eval
use; ``molt-env eval --model DIR`` serves the checkpoint instead and goes through ``EndpointPolicy``.
"""

from __future__ import annotations

from typing import Any

from env_registry.evaluation.episode import Episode, Policy, classify
from env_registry.evaluation.tasks import EnvTask
from env_registry.runners import runner_for
from molt_envs import ChatAgentRunner, Runner, SamplingParams, Trajectory
from molt_envs.seats import SeatRunner


class EnginePolicy(Policy):
    """Generate with ``engine`` + ``tokenizer`` in this process.

    Args:
        engine: any ``molt_envs.Engine``.
        tokenizer: the model's tokenizer (chat template included).
        max_length: the context budget of one episode, in tokens.
        name: how the summary names the model (e.g. ``hf:/path/to/checkpoint``).
        runner: a runner to use for every task instead of the env's own (``--train.agent_path``).
        keep_session_servers: leave this loop's ChatAgent session servers running at the end (the trainer's
            rollouts share them).
    """

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        max_length: int,
        name: str,
        runner: Runner | None = None,
        keep_session_servers: bool = False,
    ) -> None:
        self.engine, self.tokenizer, self.max_length = engine, tokenizer, max_length
        self.name = name
        self.override = runner
        self.keep_session_servers = keep_session_servers
        self._runners: dict[str, Runner] = {}

    def _runner(self, task: EnvTask) -> Runner:
        if self.override is not None:
            return self.override
        runner = self._runners.get(task.env_id)
        if runner is None:
            runner = self._runners[task.env_id] = runner_for(task.given_id or task.env_id)
        return runner

    async def close(self) -> None:
        from molt_envs.chat_runner import close_session_servers

        if not self.keep_session_servers:
            await close_session_servers()

    async def run(self, task: EnvTask, row: dict[str, Any], params: SamplingParams) -> Episode:
        runner = self._runner(task)
        result = await runner.run_row(row, params, self.max_length, self.tokenizer, self.engine)
        segments: list[Trajectory] = result if isinstance(result, list) else [result]
        episode = self.episode(segments, chat=isinstance(runner, ChatAgentRunner))
        if isinstance(runner, SeatRunner) and episode.reward is not None and len(segments) > 1:
            rewards = {str(s.info.get("seat", i)): s.reward for i, s in enumerate(segments)}
            episode.reward = episode.score = sum(rewards.values()) / len(rewards)
            episode.info["seat_rewards"] = rewards
        return episode

    def episode(self, segments: list[Trajectory], chat: bool) -> Episode:
        """An ``Episode`` from a runner's trajectory (or a ChatAgent's segments)."""
        first = segments[0]
        decode = self.tokenizer.decode
        actions = [decode(s.token_ids[a:b], skip_special_tokens=False) for s in segments for a, b in s.action_ranges]
        if chat:  # a reply as the agent saw it: the session server drops the final end-of-turn token
            eos = getattr(self.tokenizer, "eos_token", None) or ""
            actions = [a[: -len(eos)] if eos and a.endswith(eos) else a for a in actions]
        episode = Episode(
            transcript=[decode(s.token_ids, skip_special_tokens=False) for s in segments],
            actions=actions,
            prompt_tokens=first.prompt_len,
            completion_tokens=sum(s.num_action_tokens for s in segments),
            turns=sum(len(s.action_ranges) for s in segments) if chat else first.num_turns,
            truncated=any(s.truncated for s in segments),
            info=dict(first.info),
        )
        if first.failure is not None:
            episode.failure = classify(first.failure)
            return episode
        episode.reward, episode.score = first.reward, first.score
        return episode
