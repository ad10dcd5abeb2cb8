"""The command configs: ``RLConfig``, ``SFTConfig``, ``EvalCommandConfig``, and ``parse(command, argv)``.

Every flag is declared once, as a field of its group (type, default, help: ``flags.option``), and keeps that name
from the command line to the worker that reads it: ``--actor.eps_clip_low_high`` is ``cfg.actor.eps_clip_low_high``
in the controller, in the Ray actors (which receive the group objects themselves) and in the loss. The command
configs hold the groups their command reads; building one fills the dependent defaults and refuses combinations
that would silently train the wrong thing, with a ``ConfigError`` naming the flags. ``parse(command, argv)`` is the
command line's way in (a refused value exits with status 2).

The shared groups live in ``groups.py``; the algorithm's groups and rules in ``algo.py`` (``validate_algo``), the
vllm engine's in ``engine.py`` (``validate_engine``), the model split's in ``fsdp.py`` (``check_fsdp``). To add a
flag: a field in its group. To add a group: a frozen dataclass, a ``group(...)`` field in the command configs that
read it, its cross-flag rules called from that command's ``_validate``.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from molt_train.actor_backend import AUTOMODEL_INSTALL_HINT
from molt_train.config import flags
from molt_train.config.algo import AlgoConfig, CriticConfig, RewardConfig, algo_defaults, validate_algo
from molt_train.config.engine import VLLM_INSTALL_HINT, VLLMConfig, validate_engine
from molt_train.config.flags import ConfigError, group, option
from molt_train.config.fsdp import FSDPConfig, check_attention, check_fsdp
from molt_train.config.groups import (
    ActorConfig,
    CkptConfig,
    DataConfig,
    EvalConfig,
    JudgeConfig,
    LoggerConfig,
    ModelConfig,
    RayConfig,
    RefConfig,
    RolloutConfig,
    TrainConfig,
)
from molt_train.config.inert import check_inert

__all__ = ["COMMANDS", "EvalCommandConfig", "RLConfig", "SFTConfig", "check_env_mix", "parse"]

LORA_FIELDS = ("lora_dim", "lora_alpha", "lora_target_modules")

ENV_HELP = (
    "registered env ID (ns/name-vN); its train split gives prompts and labels. Repeat as ID:WEIGHT for a mix "
    "(weights normalised; each batch drawn by weight)"
)


# -- the commands --


@dataclass(frozen=True)
class RLConfig:
    """``molt-train rl``: online RL on a registered env."""

    env: tuple[str, ...] = option((), ENV_HELP, repeat=True)
    ray: RayConfig = group(RayConfig)
    actor: ActorConfig = group(ActorConfig)
    fsdp: FSDPConfig = group(FSDPConfig)
    ref: RefConfig = group(RefConfig)
    model: ModelConfig = group(ModelConfig, only=LORA_FIELDS)
    data: DataConfig = group(DataConfig)
    rollout: RolloutConfig = group(RolloutConfig)
    algo: AlgoConfig = group(AlgoConfig)
    critic: CriticConfig = group(CriticConfig)
    reward: RewardConfig = group(RewardConfig)
    vllm: VLLMConfig = group(VLLMConfig)
    train: TrainConfig = group(TrainConfig)
    ckpt: CkptConfig = group(CkptConfig)
    eval: EvalConfig = group(EvalConfig)
    logger: LoggerConfig = group(LoggerConfig)
    judge: JudgeConfig = group(JudgeConfig)

    def __post_init__(self) -> None:
        check_env_mix(self)
        flags.check_declared(self, "rl")
        check_inert(self, "rl")  # before the dependent defaults: what was given
        _set(self, "actor", replace(self.actor, num_workers=_trainer_ranks(self.actor)))
        if self.rollout.engine == "vllm":
            _set(self, "vllm", replace(self.vllm, max_model_len=self.vllm.max_model_len or self.data.max_len))
        if self.ref.num_gpus_per_node:  # the seed's way to give the reference GPUs of its own
            _set(self, "train", replace(self.train, colocate_fsdp_models=False))
        _set(self, "algo", algo_defaults(self.algo))
        self._validate()

    @property
    def sampling_temperature(self) -> float:
        """The temperature log-probs are computed at: the rollout's (greedy rollouts: 1)."""
        return self.rollout.temperature or 1.0

    @property
    def kl_as_reward(self) -> bool:
        return self.algo.kl.init_coef > 0 and not self.algo.kl.use_loss

    def _validate(self) -> None:
        if not self.eval.eval_only:
            _require_data(self)
        _require_output_dir(self)
        if not self.env and self.train.agent_path is None and self.algo.advantage.estimator != "on_policy_distill":
            raise ConfigError("no agent: pass --env ns/name-vN or --train.agent_path agent.py")
        if self.actor.model_name_or_path is None:
            raise ConfigError("--actor.model_name_or_path is required (e.g. runs/sft/hf from `molt-train sft`)")
        check_fsdp(self.fsdp, self.actor.num_workers, self.actor.backend, self.model.lora_dim)
        check_attention(self.fsdp, self.actor.backend, _importable("flash_attn"))
        _validate_seed_flags(self)
        train = self.train
        if train.force_sync_mode and train.async_queue_size > 1:
            raise ConfigError(
                f"--train.force_sync_mode is strictly on-policy and contradicts --train.async_queue_size "
                f"{train.async_queue_size}; drop one of them"
            )
        if self.rollout.max_new_tokens >= self.data.max_len:
            raise ConfigError(
                f"--rollout.max_new_tokens {self.rollout.max_new_tokens} leaves no room for the prompt "
                f"under --data.max_len {self.data.max_len}"
            )
        if not 0 < self.rollout.top_p <= 1:
            raise ConfigError(f"--rollout.top_p must be in (0, 1], got {self.rollout.top_p}")
        validate_engine(self)
        validate_algo(self)
        _validate_lora(self)
        _require_installed(self.actor.backend, self.rollout.engine)
        self._validate_run_modes()

    def _validate_run_modes(self) -> None:
        """``--eval.eval_only`` and ``--train.rollout_dump_dir`` / ``rollout_replay_dir``: runs that skip a part."""
        ev, train = self.eval, self.train
        if ev.top_p is not None and not 0 < ev.top_p <= 1:
            raise ConfigError(f"--eval.top_p must be in (0, 1], got {ev.top_p}")
        if ev.eval_only:
            if not self.env and ev.dataset is None:
                raise ConfigError(
                    "--eval.eval_only needs rows: pass --env ns/name-vN (its --eval.split) or --eval.dataset FILE"
                )
            if ev.max_samples == 0:
                raise ConfigError("--eval.eval_only with --eval.max_samples 0 has nothing to score; drop one of them")
            for flag, value in (
                ("--ckpt.load_enable", self.ckpt.load_enable),
                ("--train.rollout_replay_dir", train.rollout_replay_dir),
                ("--train.rollout_dump_dir", train.rollout_dump_dir),
            ):
                if value:
                    raise ConfigError(
                        f"--eval.eval_only scores --actor.model_name_or_path and trains nothing, so {flag} does "
                        "nothing; drop it (to score a checkpoint, pass its hf/ directory as --actor.model_name_or_path)"
                    )
        if train.colocate_all and not train.colocate_fsdp_models:
            raise ConfigError(
                "--train.colocate_all puts the reference ranks on the policy's GPUs, which "
                "--no-train.colocate_fsdp_models forbids; drop one of them"
            )
        if self.judge.policy and self.judge.model_name_or_path:
            raise ConfigError(
                "--judge.policy (the policy judges) and --judge.model_name_or_path (a frozen judge) are two judges; "
                "keep one"
            )
        if train.routing is not None and (self.actor.backend != "hf" or self.actor.compile):
            raise ConfigError(
                "--train.routing_replay / --train.record_routing wrap the routers of transformers' MoE models in "
                "eager mode: they need --actor.backend hf without --actor.compile"
            )
        if train.rollout_replay_dir is None:
            return
        if self.judge.enabled:
            raise ConfigError(
                "--train.rollout_replay_dir builds no rollout engine and runs no env, so no judge is called; "
                "drop --judge.*"
            )
        if train.rollout_dump_dir is not None:
            raise ConfigError(
                "--train.rollout_replay_dir trains on dumped batches and generates none, so there is nothing for "
                "--train.rollout_dump_dir to write; drop one of them"
            )
        if not Path(train.rollout_replay_dir).is_dir():
            raise ConfigError(
                f"--train.rollout_replay_dir {train.rollout_replay_dir!r} is not a directory; pass the "
                "--train.rollout_dump_dir of an earlier run"
            )
        for flag, value in (
            ("--eval.steps", ev.steps),
            ("--eval.eval_at_start", ev.eval_at_start),
            ("--train.partial_rollout_enable", train.partial_rollout_enable),
            ("--train.check_weight_update_equal", train.check_weight_update_equal),
        ):
            if value:
                raise ConfigError(f"--train.rollout_replay_dir builds no rollout engine, so {flag} cannot act; drop it")


@dataclass(frozen=True)
class SFTConfig:
    """``molt-train sft``: supervised fine-tuning on an env's reference completions."""

    env: tuple[str, ...] = option((), ENV_HELP, repeat=True)
    ray: RayConfig = group(RayConfig)
    model: ModelConfig = group(ModelConfig)
    actor: ActorConfig = group(ActorConfig)
    fsdp: FSDPConfig = group(FSDPConfig)
    data: DataConfig = group(DataConfig)
    train: TrainConfig = group(TrainConfig, num_steps=200, batch_size=64)
    rollout: RolloutConfig = group(RolloutConfig)  # generation limits of the final eval
    ckpt: CkptConfig = group(CkptConfig)
    eval: EvalConfig = group(EvalConfig)
    logger: LoggerConfig = group(LoggerConfig)

    def __post_init__(self) -> None:
        check_env_mix(self)
        flags.check_declared(self, "sft")
        check_inert(self, "sft")
        _require_data(self)
        _require_output_dir(self)
        if (self.model.config is None) == (self.actor.model_name_or_path is None):
            raise ConfigError(
                "pass exactly one of --model.config tiny|tiny-vl (train from scratch) and "
                "--actor.model_name_or_path DIR (fine-tune a checkpoint)"
            )
        if self.train.batch_size < 1:
            raise ConfigError(f"--train.batch_size must be >= 1, got {self.train.batch_size}")
        check_fsdp(self.fsdp, self.actor.num_workers, self.actor.backend, self.model.lora_dim)
        check_attention(self.fsdp, self.actor.backend, _importable("flash_attn"))
        if self.model.lora_dim and self.model.config is not None:
            raise ConfigError(
                "--model.lora_dim trains adapters over a pretrained model; --model.config tiny builds an untrained "
                "one: drop --model.lora_dim, or pass --actor.model_name_or_path DIR instead of --model.config"
            )
        _validate_lora(self)
        _require_installed(self.actor.backend, "hf")


@dataclass(frozen=True)
class EvalCommandConfig:
    """``molt-train eval``: a checkpoint's accuracy on an env's held-out split (or on each env's of a mix)."""

    env: tuple[str, ...] = option(
        (),
        "registered env ID (ns/name-vN); its --eval.split gives the rows. Repeat (ID or ID:WEIGHT, as for rl and "
        "sft) to score each env's split: figures per env (<ID>/accuracy, ...) next to the overall ones, which are "
        "over all rows (a weight changes nothing here)",
        repeat=True,
    )
    actor: ActorConfig = group(ActorConfig, only=("model_name_or_path",))
    data: DataConfig = group(DataConfig, only=("max_len",))
    rollout: RolloutConfig = group(RolloutConfig, only=("max_new_tokens", "timeout_s", "max_batch_size"))
    train: TrainConfig = group(TrainConfig, only=("agent_path",))
    eval: EvalConfig = group(EvalConfig)

    def __post_init__(self) -> None:
        check_env_mix(self)
        flags.check_declared(self, "eval")
        check_inert(self, "eval")
        if self.actor.model_name_or_path is None:
            raise ConfigError("--actor.model_name_or_path is required (the checkpoint to score)")
        if not self.env:
            raise ConfigError("pass --env ns/name-vN (its --eval.split gives the rows)")
        if len(self.env) > 1 and self.eval.dataset:
            raise ConfigError(
                f"--eval.dataset {self.eval.dataset!r} holds one env's rows; give one --env with it, not a mix"
            )


COMMANDS: dict[str, type] = {"rl": RLConfig, "sft": SFTConfig, "eval": EvalCommandConfig}


def parse(command: str, argv: Sequence[str] | None) -> Any:
    """``command``'s config from ``argv``; a refused value exits with status 2 and a message naming the flag."""
    cls = COMMANDS[command]
    return flags.parse(cls, command, argv, description=cls.__doc__.splitlines()[0].replace("``", ""))


# -- rules several commands share --


def check_env_mix(cfg: RLConfig | SFTConfig | EvalCommandConfig) -> None:
    """Make ``cfg.env`` a tuple of ``--env`` values, each a known ID with a valid weight, before anything starts.

    Raises:
        ConfigError: an unknown or malformed ID, a weight that is not a number > 0, an ID given twice, or a mix
            combined with a single env's ``--data.prompt_dataset`` / ``--train.agent_path``.
    """
    # imported here, not at the top: vLLM's worker processes import this package (the --vllm.* defaults), not envs
    import env_registry
    from env_registry.mix import parse_env_mix

    object.__setattr__(cfg, "env", (cfg.env,) if isinstance(cfg.env, str) else tuple(cfg.env or ()))
    try:
        parse_env_mix(cfg.env, resolve=env_registry.spec) if cfg.env else None
    except env_registry.Error as exc:  # an unknown or malformed ID, a bad weight, an ID given twice
        raise ConfigError(str(exc)) from None
    for flag, value in (
        ("--data.prompt_dataset", cfg.data.prompt_dataset),
        ("--train.agent_path", cfg.train.agent_path),
    ):
        if len(cfg.env) > 1 and value:
            raise ConfigError(
                f"{flag} {value!r} stands for one env's data or runner; give one --env with it, not a mix"
            )


def _set(cfg: Any, name: str, value: Any) -> None:
    """Fill a dependent default while the frozen config is being built."""
    object.__setattr__(cfg, name, value)


def _trainer_ranks(actor: ActorConfig) -> int:
    gpus = actor.num_gpus_per_node
    if gpus < 0 or (gpus and actor.num_workers not in (1, gpus)):
        raise ConfigError(
            f"--actor.num_gpus_per_node {gpus} gives one trainer rank per GPU, which contradicts "
            f"--actor.num_workers {actor.num_workers}; pass only one of them"
        )
    return gpus or actor.num_workers


def _validate_seed_flags(cfg: RLConfig) -> None:
    """The seed README's RL flags that need what this trainer places differently or does not build."""
    ref, train = cfg.ref, cfg.train
    if ref.num_nodes != 1:
        raise ConfigError(
            f"--ref.num_nodes {ref.num_nodes}: the reference ranks are placed with the policy's, on the cluster Ray "
            "gives (--ray.address joins one); reference groups of their own nodes are not built: drop it"
        )
    if ref.num_gpus_per_node:
        if ref.num_gpus_per_node != cfg.actor.num_workers:
            raise ConfigError(
                f"--ref.num_gpus_per_node {ref.num_gpus_per_node}: the reference has one rank per policy rank, so it "
                f"takes --actor.num_workers ({cfg.actor.num_workers}) GPUs of its own; pass "
                f"--ref.num_gpus_per_node {cfg.actor.num_workers} or change --actor.num_gpus_per_node"
            )
        if train.colocate_all:
            raise ConfigError(
                "--ref.num_gpus_per_node gives the reference GPUs of its own, and --train.colocate_all puts it on "
                "the policy's; drop one of them"
            )
    if train.batch_invariant:
        raise ConfigError(
            "--train.batch_invariant needs vLLM's batch-invariant kernels on CUDA GPUs in both the rollout engine "
            "and the trainer, which are not built here (the seed's own main does not ship them either); drop it. "
            "Measure the train/rollout gap with --algo.advantage.is_correction_level instead"
        )
    if train.force_on_policy and not train.on_policy:
        raise ConfigError(
            "--train.force_on_policy trains strictly on-policy, which --no-train.force_sync_mode / "
            "--train.async_queue_size > 1 / --train.partial_rollout_enable (overlap) contradict; drop one of them"
        )
    if train.force_on_policy and train.max_epochs > 1:
        raise ConfigError(
            f"--train.force_on_policy trains strictly on-policy, and --train.max_epochs {train.max_epochs} takes "
            "later optimizer steps on samples of an older policy; use --train.max_epochs 1"
        )


def _require_data(cfg: RLConfig | SFTConfig) -> None:
    if not cfg.env and cfg.data.prompt_dataset is None:
        raise ConfigError("no data: pass --env ns/name-vN (its train split) or --data.prompt_dataset FILE.jsonl")


def _require_output_dir(cfg: RLConfig | SFTConfig) -> None:
    if cfg.ckpt.output_dir is None:
        raise ConfigError("--ckpt.output_dir is required (metrics, checkpoints and the final hf/ model go there)")


def _validate_lora(cfg: RLConfig | SFTConfig) -> None:
    model = cfg.model
    if not model.lora_dim:
        if model.lora_target_modules:
            raise ConfigError("--model.lora_target_modules needs --model.lora_dim > 0 (the LoRA rank)")
        return
    if cfg.actor.backend != "hf":
        raise ConfigError(
            f"--model.lora_dim injects PEFT adapters into a transformers model; --actor.backend "
            f"{cfg.actor.backend} is not supported with LoRA: use --actor.backend hf"
        )
    if model.lora_alpha <= 0:
        raise ConfigError(f"--model.lora_alpha must be > 0 with --model.lora_dim, got {model.lora_alpha}")
    if cfg.rollout.engine == "vllm" and cfg.train.check_weight_update_equal:
        raise ConfigError(
            "--train.check_weight_update_equal compares the engine's parameters with the trainer's, but with "
            "--model.lora_dim the vllm engine keeps the base weights and serves the adapter directory the trainer "
            "writes: drop --train.check_weight_update_equal (the hf engine's LoRA sync is checked)"
        )
    if cfg.actor.adam.lr < 1e-4:
        logging.getLogger(__name__).warning(
            "--model.lora_dim %d with --actor.adam.lr %g: adapters need a LoRA-scale learning rate (1e-4 and up)",
            model.lora_dim,
            cfg.actor.adam.lr,
        )


def _require_installed(backend: str, engine: str) -> None:
    """Optional packages the chosen engine / backend import, checked before anything starts."""
    if engine == "vllm" and not _importable("vllm"):
        raise ConfigError(f"{VLLM_INSTALL_HINT} (vllm is not importable in this environment)")
    if backend == "automodel" and not _importable("nemo_automodel"):
        raise ConfigError(f"{AUTOMODEL_INSTALL_HINT} (nemo_automodel is not importable in this environment)")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or half-initialised install
        return False
