"""The trainer's typed configuration: every flag of ``molt-train rl | sft | eval``, declared once, and its validation.

One frozen dataclass per flag group, one per command, each module holding its groups and every rule on them:
``flags`` (the dotted-flag machinery: ``option``, ``group``, ``ConfigError``, argparse, the README tables),
``groups`` (the shared groups), ``algo`` (``--algo.*``, ``--critic.*``, ``--reward.*``), ``engine`` (``--vllm.*``
and the rollout engine's rules), ``fsdp`` (``--fsdp.*``), ``commands`` (``RLConfig``, ``SFTConfig``,
``EvalCommandConfig``, ``parse``). ``python -m molt_train.config`` prints the flag tables of molt_train/README.md.

May import: ``molt_train.algorithms`` (the estimator, loss and IS registries are the choices of flags),
``molt_train.actor_backend`` (``--actor.backend``'s choices and install hint) and ``env_registry`` (``--env``
mixes); never the trainers, workers, engines or CLIs, which all import it. Modules of this package import each other
by their defining module, never through this ``__init__``, which re-exports the public names for code outside.
"""

from molt_train.config.algo import AdvantageConfig, AlgoConfig, CriticConfig, KLConfig, RewardConfig
from molt_train.config.commands import COMMANDS, EvalCommandConfig, RLConfig, SFTConfig, parse
from molt_train.config.engine import VLLMConfig
from molt_train.config.flags import ConfigError
from molt_train.config.fsdp import FSDPConfig
from molt_train.config.groups import (
    ActorConfig,
    AdamConfig,
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

__all__ = [
    "COMMANDS",
    "ActorConfig",
    "AdamConfig",
    "AdvantageConfig",
    "AlgoConfig",
    "CkptConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "EvalCommandConfig",
    "EvalConfig",
    "FSDPConfig",
    "JudgeConfig",
    "KLConfig",
    "LoggerConfig",
    "ModelConfig",
    "RLConfig",
    "RayConfig",
    "RefConfig",
    "RewardConfig",
    "RolloutConfig",
    "SFTConfig",
    "TrainConfig",
    "VLLMConfig",
    "parse",
]
