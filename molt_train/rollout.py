"""``RolloutWorker``: a Ray actor hosting the rollout engine (hf, or vllm started by ``start_vllm``) and the agent
runner; it turns prompt batches into groups of trajectories, feeds the async queue, evaluates on held-out splits,
and takes weight syncs.

Weight syncs and rollouts in flight: the hf engine swaps weights between two decode steps. The vllm engine pauses
the requests in flight, loads and resumes them on the new weights only with ``partial_rollout``; otherwise a sync
waits until the batch being generated is complete, so every trajectory comes from one set of weights.

Every prompt gets ``n_samples_per_prompt`` rollouts sharing a ``group_id``; a runner may return one Trajectory, a
list of segment Trajectories sharing a ``rollout_id``, or one Trajectory per seat of a game (grouped per seat:
``experience.estimator_group``). A vision model's runner gets its processor (and each row's images); a text
model's its tokenizer. An episode that fails (the runner records a failure, raises,
or exceeds the timeout) or cannot be trained on is dropped whole and counted by reason; the batch goes on.

With ``record_routing`` (an MoE model, ``--train.routing_replay`` or ``--train.record_routing``) the engine records
the experts of every position it forwards, and each kept segment carries them in ``info["routing"]``
(``molt_train.routing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import pickle
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from molt_envs import SamplingParams, Trajectory, load_agent_runner
from molt_envs.vision import text_tokenizer
from molt_train.data import MixSampler, env_mix, load_eval_rows
from molt_train.deadline import within_deadline
from molt_train.engines.hf import HFEngine
from molt_train.env_server_actors import serve_here
from molt_train.experience import as_trajectories, drop_reason, estimator_group
from molt_train.models.multimodal import placeholder_ids

if TYPE_CHECKING:
    from molt_train.config.commands import EvalCommandConfig, RLConfig, SFTConfig


def episode_seed(seed: int, step: int, row: int, sample: int) -> int:
    digest = hashlib.sha256(f"{seed}:{step}:{row}:{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


class RolloutWorker:
    def __init__(
        self,
        model_path: str,
        *,
        env_id: str | Sequence[str] | None,
        agent_path: str | None,
        max_len: int,
        timeout_s: float,
        max_batch_size: int,
        num_threads: int | None = None,
        engine: str = "hf",
        partial_rollout: bool = False,
        top_logprobs: int = 0,
        record_routing: bool = False,
        lora: Any = None,
        adapter_dir: str | None = None,
        device: str = "cpu",
        env_installs: dict[str, Any] | None = None,
    ) -> None:
        if num_threads:
            torch.set_num_threads(num_threads)
        self.model_path = model_path
        if engine == "hf":
            self.engine: Any = HFEngine.from_pretrained(
                model_path,
                device=device,
                max_batch_size=max_batch_size,
                top_logprobs=top_logprobs,
                record_routing=record_routing,
            )
            self.tokenizer = self.engine.processor  # what runners take: the tokenizer or a VLM's processor
            if lora is not None:  # the policy's adapters (B = 0, or a resumed run's): syncs send only them
                from molt_train import lora as lora_adapters

                lora_adapters.inject(self.engine.model, lora, adapter_dir)
        elif engine == "vllm":
            from molt_train.models.multimodal import load_processor

            self.engine = None  # start_vllm, on this actor's event loop
            self.tokenizer = load_processor(model_path)
        else:
            raise ValueError(f"unknown rollout engine {engine!r}; choose hf or vllm")
        self.placeholders = placeholder_ids(self.tokenizer)
        self.whole_batches = engine == "vllm" and not partial_rollout
        self._batch_lock: asyncio.Lock | None = None
        ids = [env_id] if isinstance(env_id, str) else list(env_id or ())
        # a Ray run's isolated installs: an env server of this worker's own on its node, owned by a Ray actor
        self.env_servers = serve_here(env_installs) if env_installs else []
        self.env_id = ids[0] if ids else None  # evaluation of rows that name no env
        self.runners: dict[str, Any] = {}  # a row's env -> its runner; a row of no env (or an agent) -> self.runner
        if agent_path:
            self.runner = load_agent_runner(agent_path)
        elif not ids:  # on-policy distillation on a prompt file: sample, the teacher grades
            from molt_train.distill_agent import AgentRunner

            self.runner = AgentRunner()
        else:
            import env_registry

            self.runners = {e: env_registry.runner_for(e) for e in ids}
            self.runner = next(iter(self.runners.values()), None)
        for runner in [self.runner, *self.runners.values()]:
            if hasattr(runner, "engine_loader"):  # a game's frozen-checkpoint seats: an hf engine of their own
                runner.engine_loader = lambda path: (e := HFEngine.from_pretrained(path), e.tokenizer)
        self.max_len, self.timeout_s = max_len, timeout_s
        self.top_logprobs, self.lora, self.adapter_dir = top_logprobs, lora, adapter_dir
        self.record_routing = record_routing
        self.rows: list[dict[str, Any]] = []
        self.sampler: MixSampler | None = None
        self.shard, self.shards = 0, 1
        self.judge_server: Any = None  # start_judge

    async def start_judge(self, judge: Any) -> str:
        """Serve LLM-as-judge calls (the ``--judge.*`` group, ``JudgeConfig``) from this actor's loop: through the
        rollout engine itself (``policy``: the current policy, weight syncs reach it) or a frozen judge model on an hf
        engine of its own. Every episode's runner gets a ``JudgeClient`` for the endpoint; returns its base URL."""
        from molt_envs.judge import JudgeClient
        from molt_envs.sessions.server import SessionServer

        if judge.model_name_or_path:
            engine = await asyncio.to_thread(HFEngine.from_pretrained, str(judge.model_name_or_path))
            tokenizer = engine.tokenizer
        else:
            engine, tokenizer = self.engine, self.tokenizer
        self.judge_server = SessionServer(engine, tokenizer, model_name="judge", max_length=self.max_len)
        root = await self.judge_server.start()
        client = JudgeClient(base_url=f"{root}/judge/v1", timeout_s=judge.timeout_s, max_tokens=judge.max_new_tokens)
        for runner in [self.runner, *self.runners.values()]:  # one client: its counters cover every env
            if runner is not None:
                runner.judge = client
        return client.base_url

    async def start_vllm(self, options: Any, seed: int, devices: list[str] | None = None) -> None:
        """Start the vLLM engine (the ``--vllm.*`` group, ``VLLMConfig``) on the loop that will generate from it;
        blocks that loop the 40-80 s vLLM takes to start, before any rollout exists. ``devices``: the GPUs (as
        ``CUDA_VISIBLE_DEVICES`` entries) the engine's worker processes run on, when not this actor's own (a
        colocated engine over several trainer GPUs); the processes vLLM spawns inherit them."""
        from molt_train.engines.vllm import VLLMEngine

        if devices:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        rank = self.lora.lora_dim if self.lora is not None else 0
        self.engine = VLLMEngine(
            self.model_path,
            options,
            seed=seed,
            tokenizer=text_tokenizer(self.tokenizer),
            lora_rank=rank,
            record_routing=self.record_routing,
        )
        if self.adapter_dir is not None:  # a resumed LoRA run: serve its adapter from the first request
            await self.engine.load_lora_adapter(self.adapter_dir)

    def set_prompts(
        self,
        rows: list[dict[str, Any]],
        batch_size: int,
        seed: int,
        weights: dict[str | None, float] | None = None,
        state: dict[str, Any] | None = None,
        start: int = 0,
        shard: int = 0,
        shards: int = 1,
    ) -> None:
        """The rows batches are drawn from, by env ``weights`` (``MixSampler``; ``state`` at batch ``start`` when
        resuming); this worker generates every ``shards``-th prompt of a batch, from ``shard`` on (one of
        ``--rollout.num_workers``). Rows arrive through Ray, so no node reads the driver's dataset files."""
        self.rows, self.sampler = rows, MixSampler(rows, weights, batch_size, seed, state, start)
        self.shard, self.shards = shard, shards

    async def connect(self, *queues: Any) -> None:
        """Reach each ``ray.util.queue.Queue`` once: the first call from this actor to a queue actor waits for that
        actor to start and opens the connection (~0.3 s), which belongs to start-up, not to the first batch."""
        await asyncio.gather(*(q.actor.qsize.remote() for q in queues))

    # -- rollout --
    async def generate_step(self, step: int, params: dict[str, Any], n_samples: int, seed: int) -> dict[str, Any]:
        """Rollouts for the prompts of batch ``step``: kept trajectories (and the env of each), drop counts (overall
        and per env), the sampler's state after the batch (each env's data position), timing.

        A group is one prompt's samples, so it never holds two envs; its id names the env (``step:env:row``)."""
        start = time.time()
        base = SamplingParams(**params)
        jobs, envs = [], []
        for i in self.sampler.batch(step)[self.shard :: self.shards]:
            env = self.rows[i].get("env")
            for j in range(n_samples):
                params_j = base.updated(seed=episode_seed(seed, step, i, j))
                jobs.append(self._episode(self.rows[i], params_j, f"{step}:{env}:{i}" if env else f"{step}:{i}"))
                envs.append(env)
        judge = self.runner.judge.stats.snapshot() if self.runner.judge is not None else None
        counters = self._counters()
        async with self._whole_batch():
            results = await asyncio.gather(*jobs)
        if self.top_logprobs:  # what no kept trajectory claimed (failed episodes, evaluation)
            self.engine.top_table.clear()
        if self.record_routing:  # kept segments copied theirs
            self.engine.routing_table.clear()
        kept: list[Trajectory] = []
        kept_envs: list[str | None] = []
        dropped: dict[str, int] = {}
        per_env: dict[str, dict[str, Any]] = {}
        for env, (segments, reason) in zip(envs, results, strict=True):
            if env is not None:
                counts = per_env.setdefault(env, {"num_rollouts": 0, "dropped": {}})
                counts["num_rollouts"] += 1
            if reason is None:
                kept.extend(segments)
                kept_envs.extend([env] * len(segments))
            else:
                dropped[reason] = dropped.get(reason, 0) + 1
                if env is not None:
                    counts["dropped"][reason] = counts["dropped"].get(reason, 0) + 1
        batch = {
            "step": step,
            "trajectories": kept,
            "trajectory_envs": kept_envs,
            "dropped": dropped,
            "num_rollouts": len(results),
            "per_env": per_env,
            "counters": {k: v - counters.get(k, 0) for k, v in self._counters().items()},
            "data_state": self.sampler.state(),
            "start": start,
            "end": time.time(),
        }
        if judge is not None:  # this batch's judge calls (an eval running meanwhile adds its own)
            batch["judge"] = {k: v - judge[k] for k, v in self.runner.judge.stats.snapshot().items()}
        return batch

    @staticmethod
    def _counters() -> dict[str, float]:
        """This process's fault and queue counters so far: its sandbox pools' (``sandbox/retries``,
        ``sandbox/infra_errors``, ``sandbox/slot_wait_s``, ...), its env-server endpoints' waits for a free slot
        (``env_server/slot_waits``, ``env_server/slot_wait_s``) and its session servers' retries answered by replay
        (``session/replays``); a batch reports their change over it (an evaluation running meanwhile adds its own)."""
        import sandboxes
        from molt_envs.chat_runner import session_replays
        from molt_envs.remote.client import wire_stats

        counters = {f"sandbox/{k}": v for k, v in sandboxes.stats().items()}
        counters.update({f"env_server/{k}": v for k, v in wire_stats().items()})
        return {**counters, "session/replays": session_replays()}

    async def _episode(
        self, row: dict[str, Any], params: SamplingParams, group_id: str
    ) -> tuple[list[Trajectory], str | None]:
        runner = self.runners.get(row.get("env"), self.runner)
        try:
            result = await within_deadline(
                runner.run_row(row, params, self.max_len, self.tokenizer, self.engine), self.timeout_s
            )
            segments = as_trajectories(result)
        except TimeoutError:
            return [], "timeout"
        except Exception as exc:  # a runner that raises instead of recording the failure
            return [], f"runner_{type(exc).__name__}"
        if not segments:
            return [], "no_segments"
        for seg in segments:
            seg.group_id = estimator_group(seg, group_id)
            reason = drop_reason(seg, self.max_len, self.placeholders)
            if reason is None and self.top_logprobs and not group_id.startswith("eval:"):
                reason = self._attach_top_logprobs(seg)
            if reason is not None:
                return [], reason
            if self.record_routing and not group_id.startswith("eval:"):
                self._attach_routing(seg)
        return segments, None

    def _attach_routing(self, seg: Trajectory) -> None:
        """``seg.info["routing"]``: (len(token_ids) - 1, layers, k) int16, each action's record written over the
        positions its generation forwarded (a later turn's covers the earlier ones too: it wins); ``NO_RECORD`` where
        no generation of this engine forwarded a position. No record at all: no ``routing``."""
        from molt_train.routing import NO_RECORD

        routing = None
        for start, end in seg.action_ranges:
            record = self.engine.routing_record(seg.token_ids[:start], seg.token_ids[start:end])
            if record is None:
                continue
            if routing is None:
                routing = torch.full((len(seg.token_ids) - 1, *record.shape[1:]), NO_RECORD, dtype=torch.int16)
            n = min(len(record), len(routing))
            routing[:n] = record[:n]
        if routing is not None:
            seg.info["routing"] = routing

    def _attach_top_logprobs(self, seg: Trajectory) -> str | None:
        """``seg.info["top_logprobs"]``: the engine's top-k (ids, log-probs) of each token, (len(token_ids), k) each
        (log-prob -30 outside the actions); ``"no_top_logprobs"`` if an action was not generated by this engine."""
        ids = torch.zeros((len(seg.token_ids), self.top_logprobs), dtype=torch.long)
        logq = torch.full((len(seg.token_ids), self.top_logprobs), -30.0)
        for start, end in seg.action_ranges:
            top = self.engine.pop_top_logprobs(seg.token_ids[:start], seg.token_ids[start:end])
            if top is None:
                return "no_top_logprobs"
            ids[start:end], logq[start:end] = top
        seg.info["top_logprobs"] = (ids, logq)
        return None

    async def produce(
        self, queue: Any, slots: Any, start: int, end: int, params: dict[str, Any], n_samples: int, seed: int
    ) -> int:
        """Fill ``queue`` with batches ``start..end-1``, each after taking a slot (the async-queue protocol). The
        queue carries a reference to each batch (in a list, so Ray passes it on unresolved): the trainer reads the
        batch from this actor's object store, and the queue actor never copies it."""
        import ray

        for step in range(start, end):
            await slots.get_async()
            batch = await self.generate_step(step, params, n_samples, seed)
            batch["generated_tokens"] = self.engine.stats["generated_tokens"]
            await queue.put_async([ray.put(batch)])
        return end - start

    # -- evaluation --
    async def evaluate(self, rows: list[dict[str, Any]], params: dict[str, Any], n: int = 1) -> dict[str, float]:
        """``n`` samples of each of ``rows`` through ``molt-env eval``'s loop (``env_registry.evaluation``) on this
        engine: ``accuracy`` (the mean reward, a failed sample at the bottom of the reward range), ``pass@k`` for
        every k <= n, ``failed`` and ``failures/<reason>`` counts, ``response_length`` (mean completion tokens).
        Rows of envs (a mix): the same figures per env (``<env>/accuracy``, ...); the overall ones over all rows."""
        groups: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            groups.setdefault(row.get("env") or self.env_id, []).append(row)
        per_env = {env: await self._evaluate_env(env, mine, params, n) for env, mine in groups.items()}
        total = max(len(rows), 1)
        out: dict[str, float] = {"num_rows": float(len(rows))}
        for env, figures in per_env.items():
            share = figures["num_rows"] / total
            for k, v in figures.items():
                if k != "num_rows":
                    summed = k == "failed" or k.startswith("failures/")
                    out[k] = out.get(k, 0.0) + (v if summed else v * share)
            if any(r.get("env") for r in groups[env]):
                out.update({f"{env}/{k}": v for k, v in figures.items()})
        return out

    async def _evaluate_env(
        self, env_id: str, rows: list[dict[str, Any]], params: dict[str, Any], n: int
    ) -> dict[str, float]:
        import env_registry
        from env_registry.evaluation import EnginePolicy, EnvTask, EvalSettings, evaluate

        spec, factory = env_registry.registry.factory(env_id)
        task = EnvTask(spec.id, spec, factory, rows, given_id=env_id)
        settings = EvalSettings(
            n=n,
            temperature=params["temperature"],
            top_p=params.get("top_p", 1.0),
            max_new_tokens=params["max_tokens"],
            concurrency=max(1, len(rows) * n),  # the engine batches whatever is in flight
            timeout_s=self.timeout_s,
        )
        name = f"engine:{self.model_path}"
        policy = EnginePolicy(
            self.engine,
            self.tokenizer,
            self.max_len,
            name,
            self.runners.get(env_id, self.runner),
            keep_session_servers=True,
        )
        summary = await evaluate([task], policy, settings, out=None, report=False)
        out = {
            "accuracy": summary["mean_reward"],
            "num_rows": float(len(rows)),
            "failed": float(sum(summary["failures"].values())),
            "response_length": summary["completion_tokens_mean"] or 0.0,
        }
        out.update({k: v for k, v in summary.items() if k.startswith("pass@")})
        out.update({f"failures/{reason}": float(count) for reason, count in summary["failures"].items()})
        return out

    # -- weights --
    def _whole_batch(self) -> contextlib.AbstractAsyncContextManager:
        """Held by a batch being generated and by a sync when syncs must not split a batch."""
        if not self.whole_batches:
            return contextlib.nullcontext()
        if self._batch_lock is None:
            self._batch_lock = asyncio.Lock()
        return self._batch_lock

    @contextlib.asynccontextmanager
    async def _between_batches(self) -> AsyncIterator[float]:
        """A sync's turn: after the batch in flight when syncs must not split one; yields the seconds waited."""
        start = time.perf_counter()
        async with self._whole_batch():
            yield time.perf_counter() - start

    async def update_weights(self, state_dict: dict[str, torch.Tensor], check: bool = False) -> dict[str, float]:
        """hf engine: copy CPU tensors in; ``check`` then compares every engine parameter with them."""
        async with self._between_batches() as waited:
            await asyncio.to_thread(self.engine.update_weights, state_dict.items())
            timing = dict(self.engine.last_sync, wait_s=self.engine.last_sync["wait_s"] + waited)
            if check:
                params = dict(self.engine.model.named_parameters())
                if self.lora is not None:  # a LoRA run syncs (and so checks) the adapters only
                    params = {k: v for k, v in params.items() if k in state_dict}
                problems = await asyncio.to_thread(compare_weights, params, state_dict)
                timing["weight_sync/checked_params"] = float(raise_if_unequal(problems, len(params)))
        return timing

    async def load_shared_weights(
        self, payloads: list[bytes] | list[list[bytes]], nbytes: int, check: bool = False
    ) -> dict[str, float]:
        """vllm engine: load the trainer's CUDA-IPC buckets (``weight_buckets.share``; per bucket one payload, or
        one per GPU of an engine over several); ``check`` loads them again through the engine's equality check. The
        trainer keeps the buckets alive until this returns."""
        async with self._between_batches() as waited:
            await self.engine.load_shared_buckets(payloads, nbytes=nbytes)
            timing = dict(self.engine.last_sync, wait_s=self.engine.last_sync["wait_s"] + waited)
            if check:
                problems = await self.engine.check_weight_update_equal(payloads=payloads)
                tensors = sum(len(pickle.loads(p if isinstance(p, bytes) else p[0])[2]) for p in payloads)
                timing["weight_sync/checked_params"] = float(raise_if_unequal(problems, tensors))
        return timing

    async def load_lora_adapter(self, adapter_dir: str) -> dict[str, float]:
        """vllm engine, LoRA runs: serve the trainer's adapter directory from now on."""
        async with self._between_batches() as waited:
            await self.engine.load_lora_adapter(adapter_dir)
            return dict(self.engine.last_sync, wait_s=self.engine.last_sync["wait_s"] + waited)

    async def init_weight_group(self, host: str, port: int, world_size: int) -> None:
        """vllm engine on GPUs of its own: join the trainer rank 0's NCCL weight-sync group (opened concurrently)."""
        await self.engine.init_weight_group(host, port, world_size)

    async def receive_weights(self, plan: list[tuple[bytes, int]], check: bool = False) -> dict[str, float]:
        """vllm engine on GPUs of its own: receive trainer rank 0's broadcast of ``plan``'s buckets (it sends
        concurrently, twice with ``check``: the second time through the engine's equality check)."""
        async with self._between_batches() as waited:
            await self.engine.receive_broadcast(plan)
            timing = dict(self.engine.last_sync, wait_s=self.engine.last_sync["wait_s"] + waited)
            if check:
                problems = await self.engine.check_weight_update_equal(plan=plan)
                tensors = sum(len(pickle.loads(metas)) for metas, _ in plan)
                timing["weight_sync/checked_params"] = float(raise_if_unequal(problems, tensors))
        return timing

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.engine.model.named_parameters()}

    async def sleep(self) -> None:
        await self.engine.sleep()

    async def wake_up(self) -> None:
        await self.engine.wake_up()

    async def shutdown(self) -> None:
        """Stop what this actor started that a kill would leave behind: env servers (and their logs), the judge and
        session servers, vLLM's engine-core process, sandbox jails (their cgroups and scratch dirs)."""
        import sandboxes
        from env_registry.serving.managed_servers import stop_managed_servers
        from molt_envs.chat_runner import close_session_servers

        await asyncio.gather(*(server.stop.remote() for server in self.env_servers))
        if self.judge_server is not None:
            await self.judge_server.stop()
        if hasattr(self.engine, "shutdown"):  # vllm: its engine-core process
            self.engine.shutdown()
        await close_session_servers()  # the ChatAgents' session servers (their unix sockets' directories)
        await asyncio.to_thread(stop_managed_servers)  # foreign envs' servers started in this process, and their logs
        await asyncio.to_thread(sandboxes.shutdown)  # jails, their cgroups and scratch dirs


def compare_weights(params: dict[str, torch.Tensor], trainer: dict[str, torch.Tensor]) -> list[str]:
    """``"stale: name"`` for each engine parameter unequal to the trainer's tensor (cast to its dtype),
    ``"uncovered: name"`` for each the trainer did not send."""
    problems = [f"uncovered: {name}" for name in params if name not in trainer]
    problems += [
        f"stale: {name}"
        for name, param in params.items()
        if name in trainer and not torch.equal(param.detach(), trainer[name].to(param.device, param.dtype))
    ]
    return problems


def raise_if_unequal(problems: list[str], checked: int) -> int:
    if problems:
        raise RuntimeError(
            f"--train.check_weight_update_equal: after the weight sync {len(problems)} engine "
            f"parameters differ from the trainer's: {', '.join(problems[:20])}" + (" ..." if len(problems) > 20 else "")
        )
    return checked


def eval_sampling(cfg: RLConfig | SFTConfig | EvalCommandConfig) -> dict[str, Any]:
    """Sampling at evaluation: ``--eval.temperature`` (0 = greedy), ``--eval.top_p`` and ``--eval.max_new_tokens``
    (unset ones: the rollout's)."""
    return {
        "temperature": cfg.eval.temperature,
        "top_p": cfg.eval.top_p if cfg.eval.top_p is not None else cfg.rollout.top_p,
        "max_tokens": cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
    }


def evaluate_checkpoint(cfg: SFTConfig | EvalCommandConfig, model_path: str | Path) -> dict[str, float]:
    """Score ``model_path`` on ``--eval.split`` of each ``--env`` (at most ``--eval.max_samples`` rows of each) in this
    process (no Ray), ``--eval.n_samples_per_prompt`` samples per row, through the same loop as ``molt-env eval``; on
    a GPU when this process sees one. Returns ``RolloutWorker.evaluate``'s figures: overall and per env."""
    worker = RolloutWorker(
        str(model_path),
        env_id=[e.env_id for e in env_mix(cfg)],
        agent_path=cfg.train.agent_path,
        max_len=cfg.data.max_len,
        timeout_s=cfg.rollout.timeout_s,
        max_batch_size=cfg.rollout.max_batch_size,
        device="cuda" if torch.cuda.is_available() else "cpu",
    )
    rows = load_eval_rows(cfg)
    return asyncio.run(worker.evaluate(rows, eval_sampling(cfg), cfg.eval.n_samples_per_prompt))


def start_rollout_worker(
    cfg: RLConfig,
    model_path: str,
    *,
    num_gpus: float,
    num_threads: int,
    options: dict[str, Any],
    devices: list[str] | None = None,
    lora: Any = None,
    adapter_dir: str | None = None,
    env_installs: dict[str, Any] | None = None,
) -> Any:
    """The ``RolloutWorker`` Ray actor of ``cfg``'s engine and agent, its engine started (vLLM sizes its KV cache
    before anything else allocates).

    Args:
        cfg: the run's config (engine, agent, ``--algo.advantage.score_centering_top_k``'s top-k log-probs, judge).
        model_path: the checkpoint the engine serves (a LoRA run: the base model).
        num_gpus / num_threads / options: the actor's GPU share, torch CPU threads and Ray options (its bundle).
        devices: the GPUs a colocated vLLM engine of several GPUs runs its workers on (``placement.bundle_gpu_ids``),
            None for the actor's own.
        lora: a LoRA run's ``--model.*`` group (the engine serves the policy's adapters), else None.
        adapter_dir: a resumed LoRA run's PEFT adapter directory, served from the first request; else None.
        env_installs: the run's isolated installs (``env_server_actors.isolated_installs``); the worker serves each from
            an ``EnvServerActor`` on its node.

    Returns:
        The actor handle.
    """
    import ray

    agent_path = str(Path(cfg.train.agent_path).resolve()) if cfg.train.agent_path else None
    actor = ray.remote(num_cpus=0, num_gpus=num_gpus)(RolloutWorker)
    rollout = actor.options(max_concurrency=1000, **options).remote(
        model_path,
        env_id=[e.env_id for e in env_mix(cfg)],
        agent_path=agent_path,
        max_len=cfg.data.max_len,
        timeout_s=cfg.rollout.timeout_s,
        max_batch_size=cfg.rollout.max_batch_size,
        num_threads=num_threads,
        engine=cfg.rollout.engine,
        partial_rollout=cfg.train.partial_rollout_enable,
        top_logprobs=cfg.algo.advantage.score_centering_top_k,
        record_routing=cfg.train.routing is not None,
        lora=lora,
        adapter_dir=adapter_dir,
        env_installs=env_installs,
    )
    if cfg.rollout.engine == "vllm":
        ray.get(rollout.start_vllm.remote(cfg.vllm, cfg.train.seed, devices))
    if cfg.judge.enabled:
        ray.get(rollout.start_judge.remote(cfg.judge))
    return rollout
