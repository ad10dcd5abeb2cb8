"""``RolloutWorker``: a Ray actor hosting the hf engine and the agent runner; it turns prompt batches into groups
of trajectories, feeds the async queue, evaluates on held-out splits, and takes weight syncs.

Every prompt gets ``n_samples_per_prompt`` rollouts sharing a ``group_id``; a runner may return one Trajectory or a
list of segment Trajectories sharing a ``rollout_id``. An episode that fails (the runner records a failure, raises,
or exceeds the timeout) or cannot be trained on is dropped whole and counted by reason; the batch goes on.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import torch

from molt_envs import SamplingParams, Trajectory, load_agent_runner
from molt_train.data import PromptSampler
from molt_train.engines.hf import HFEngine
from molt_train.experience import as_trajectories, drop_reason


def episode_seed(seed: int, step: int, row: int, sample: int) -> int:
    digest = hashlib.sha256(f"{seed}:{step}:{row}:{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


class RolloutWorker:
    def __init__(self, model_path: str, *, env_id: str | None, agent_path: str | None, max_len: int,
                 timeout_s: float, max_batch_size: int, num_threads: int | None = None) -> None:
        if num_threads:
            torch.set_num_threads(num_threads)
        self.engine = HFEngine.from_pretrained(model_path, max_batch_size=max_batch_size)
        self.tokenizer = self.engine.tokenizer
        if agent_path:
            self.runner = load_agent_runner(agent_path)
        else:
            import env_registry

            self.runner = env_registry.runner_for(env_id)
        self.max_len, self.timeout_s = max_len, timeout_s
        self.rows: list[dict[str, Any]] = []
        self.sampler: PromptSampler | None = None

    def set_prompts(self, rows: list[dict[str, Any]], batch_size: int, seed: int) -> None:
        self.rows, self.sampler = rows, PromptSampler(len(rows), batch_size, seed)

    # -- rollout --
    async def generate_step(self, step: int, params: dict[str, Any], n_samples: int, seed: int) -> dict[str, Any]:
        """Rollouts for the prompts of batch ``step``: kept trajectories, drop counts, timing."""
        start = time.time()
        base = SamplingParams(**params)
        jobs = []
        for i in self.sampler.batch(step):
            for j in range(n_samples):
                jobs.append(self._episode(self.rows[i], base.updated(seed=episode_seed(seed, step, i, j)), f"{step}:{i}"))
        results = await asyncio.gather(*jobs)
        kept: list[Trajectory] = []
        dropped: dict[str, int] = {}
        for segments, reason in results:
            if reason is None:
                kept.extend(segments)
            else:
                dropped[reason] = dropped.get(reason, 0) + 1
        return {"step": step, "trajectories": kept, "dropped": dropped, "num_rollouts": len(results),
                "start": start, "end": time.time()}

    async def _episode(self, row: dict[str, Any], params: SamplingParams, group_id: str) -> tuple[list[Trajectory], str | None]:
        try:
            result = await asyncio.wait_for(
                self.runner.execute(row["prompt"], row["label"], params, self.max_len, self.tokenizer, self.engine),
                self.timeout_s)
            segments = as_trajectories(result)
        except TimeoutError:
            return [], "timeout"
        except Exception as exc:  # a runner that raises instead of recording the failure
            return [], f"runner_{type(exc).__name__}"
        if not segments:
            return [], "no_segments"
        for seg in segments:
            seg.group_id = group_id
            reason = drop_reason(seg, self.max_len)
            if reason is not None:
                return [], reason
        return segments, None

    async def produce(self, queue: Any, slots: Any, start: int, end: int, params: dict[str, Any], n_samples: int,
                      seed: int) -> int:
        """Fill ``queue`` with batches ``start..end-1``, each after taking a slot (the async-queue protocol)."""
        for step in range(start, end):
            await slots.get_async()
            batch = await self.generate_step(step, params, n_samples, seed)
            await queue.put_async(batch)
        return end - start

    # -- evaluation --
    async def evaluate(self, rows: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, float]:
        """Mean reward (= accuracy for exact-match graders) over ``rows``, one sample each; failures count as 0."""
        base = SamplingParams(**params)
        results = await asyncio.gather(*[self._episode(r, base.updated(seed=k), f"eval:{k}")
                                         for k, r in enumerate(rows)])
        rewards = [segs[0].reward if reason is None else 0.0 for segs, reason in results]
        lengths = [sum(s.num_action_tokens for s in segs) for segs, reason in results if reason is None]
        return {"accuracy": sum(rewards) / max(len(rewards), 1), "num_rows": float(len(rows)),
                "failed": float(sum(reason is not None for _, reason in results)),
                "response_length": sum(lengths) / max(len(lengths), 1)}

    # -- weights --
    async def update_weights(self, state_dict: dict[str, torch.Tensor]) -> dict[str, float]:
        await asyncio.to_thread(self.engine.update_weights, state_dict.items())
        return dict(self.engine.last_sync)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.engine.model.named_parameters()}

    def engine_stats(self) -> dict[str, int]:
        return dict(self.engine.stats)
