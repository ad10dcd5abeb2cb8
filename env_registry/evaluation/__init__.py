"""Evaluation: pass@k of any env ID against a local engine or a model endpoint, with durable, resumable output.

One code path (``evaluate``) serves ``molt-env eval``, ``molt-train eval`` and the trainer's periodic eval; a
``Policy`` says what generates (``EnginePolicy`` in process, ``EndpointPolicy`` for OpenAI/Anthropic endpoints).

May import: ``store`` (``--publish-results``), ``packages`` and the top of ``env_registry``; never ``hub`` or
``validation``.
"""

from env_registry.evaluation.endpoint import EndpointPolicy
from env_registry.evaluation.engine_policy import EnginePolicy
from env_registry.evaluation.episode import REASONS, Episode, Failure, Policy
from env_registry.evaluation.passk import mean_pass_at_k, pass_at_k, resolve_ks
from env_registry.evaluation.run import evaluate
from env_registry.evaluation.summary import env_summaries
from env_registry.evaluation.tasks import EnvTask, EvalSettings, load_tasks, sample_seed

__all__ = [
    "REASONS",
    "EndpointPolicy",
    "EnginePolicy",
    "EnvTask",
    "Episode",
    "EvalSettings",
    "Failure",
    "Policy",
    "env_summaries",
    "evaluate",
    "load_tasks",
    "mean_pass_at_k",
    "pass_at_k",
    "resolve_ks",
    "sample_seed",
]
