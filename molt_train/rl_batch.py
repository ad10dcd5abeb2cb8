"""One rollout batch between the rollout workers and the optimizer: the workers' parts merged into the batch
(``merge_parts``), its reward shaping and group filtering (``shape_and_filter``), its advantages
(``estimate_advantages``) and its rollout metrics (``rollout_metrics``). Pure functions of the batch and the config,
used by ``RLTrainer`` and by the GPU step benchmark."""

from __future__ import annotations

from typing import Any

from molt_train.algorithms import AdvantageInputs, approx_kl, dynamic_filtering, get_estimator, shape_rewards
from molt_train.config.commands import RLConfig
from molt_train.experience import Experience


def merge_parts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One rollout batch from the parts ``--rollout.num_workers`` workers generated of it (each a
    ``RolloutWorker.generate_step`` result, or a lost worker's all-dropped part): trajectories in worker order, counts
    summed (overall, per env, the judge's, the fault counters), the earliest start and latest end, the sampler state of a part that has
    one (every worker draws the same batches)."""
    dropped: dict[str, int] = {}
    per_env: dict[str, dict[str, Any]] = {}
    judge: dict[str, float] = {}
    counters: dict[str, int] = {}
    for part in parts:
        for reason, count in part["dropped"].items():
            dropped[reason] = dropped.get(reason, 0) + count
        for env, counts in part.get("per_env", {}).items():
            mine = per_env.setdefault(env, {"num_rollouts": 0, "dropped": {}})
            mine["num_rollouts"] += counts["num_rollouts"]
            for reason, count in counts["dropped"].items():
                mine["dropped"][reason] = mine["dropped"].get(reason, 0) + count
        for key, value in part.get("judge", {}).items():
            judge[key] = judge.get(key, 0) + value
        for key, value in part.get("counters", {}).items():
            counters[key] = counters.get(key, 0) + value
    batch = {
        "step": parts[0]["step"],
        "trajectories": [t for part in parts for t in part["trajectories"]],
        "trajectory_envs": [e for part in parts for e in part["trajectory_envs"]],
        "dropped": dropped,
        "num_rollouts": sum(part["num_rollouts"] for part in parts),
        "per_env": per_env,
        "counters": counters,
        "start": min(part["start"] for part in parts),
        "end": max(part["end"] for part in parts),
        "generated_tokens": sum(part["generated_tokens"] for part in parts),
    }
    states = [part["data_state"] for part in parts if "data_state" in part]
    if states:
        batch["data_state"] = states[0]
    if judge:
        batch["judge"] = judge
    return batch


def shape_and_filter(exp: Experience, cfg: RLConfig) -> tuple[Experience, dict[str, float]]:
    """``--reward.*`` shaping of the rewards, then (``--algo.dynamic_filtering_enable``) the groups kept."""
    shaped, shaping = shape_rewards(
        exp.rewards, exp.rollout_ids, exp.lengths, exp.truncated, cfg.reward, cfg.data.max_len
    )
    metrics = {k: float(v) for k, v in shaping.items()}
    exp.rewards = shaped
    if cfg.algo.dynamic_filtering_enable:
        kept, filtering = dynamic_filtering(
            exp.group_ids,
            exp.rollout_ids,
            exp.scores,
            n_samples_per_prompt=cfg.rollout.n_samples_per_prompt,
            score_range=cfg.algo.dynamic_filtering_range,
        )
        metrics.update(filtering)
        exp = exp.select(kept)
        metrics["train/rows_after_filtering"] = float(len(exp))
    return exp, metrics


def estimate_advantages(exp: Experience, cfg: RLConfig) -> dict[str, float]:
    """``exp.advantages`` from its rewards by ``--algo.advantage.estimator``, the KL (to ``extra["logp_ref"]``, else
    the rollout's log-probs) a per-token reward unless ``--algo.kl.use_loss``; returns the KL and advantage metrics."""
    kl_cfg, adv, metrics = cfg.algo.kl, cfg.algo.advantage, {}
    kl = None
    if kl_cfg.init_coef > 0:
        ref = exp.extra.get("logp_ref", exp.rollout_logp)
        policy = exp.extra.get("logp_old", exp.rollout_logp)
        kl = approx_kl(policy, ref, kl_cfg.estimator)
        metrics["kl"] = float((kl * exp.action_mask).sum() / exp.action_mask.sum().clamp(min=1))
    exp.advantages, returns = get_estimator(adv.estimator)(
        AdvantageInputs(
            rewards=exp.rewards,
            action_mask=exp.action_mask,
            group_ids=exp.group_ids,
            rollout_ids=exp.rollout_ids,
            kl=kl if cfg.kl_as_reward else None,
            kl_coef=kl_cfg.init_coef if cfg.kl_as_reward else 0.0,
            gamma=adv.gamma,
            no_whiten=adv.no_whiten,
            values=exp.extra.get("values"),
            lam=adv.lam,
        )
    )
    if "values" in exp.extra:  # the critic's targets
        exp.extra["returns"] = returns
    metrics["advantage/abs_mean"] = float(exp.advantages.abs().sum() / exp.action_mask.sum().clamp(min=1))
    return metrics


def rollout_metrics(batch: dict[str, Any]) -> dict[str, float]:
    """Per-rollout averages (a rollout's segments count once), drop counts by reason, timing; the same rollout
    figures per env (``rollout/<env>/reward_mean``, ``rollout/<env>/dropped/<reason>``, ...) for rows of an env."""
    metrics = {f"rollout/{k}": v for k, v in _rollout_figures(batch["trajectories"], batch["dropped"]).items()}
    metrics["rollout/num_rollouts"] = float(batch["num_rollouts"])
    envs = batch.get("trajectory_envs", [])
    for env, counts in batch.get("per_env", {}).items():
        mine = [t for t, e in zip(batch["trajectories"], envs, strict=True) if e == env]
        figures = _rollout_figures(mine, counts["dropped"]) | {"num_rollouts": float(counts["num_rollouts"])}
        metrics.update({f"rollout/{env}/{k}": v for k, v in figures.items()})
    metrics.update(batch.get("counters", {}))  # sandbox/<counter>, session/replays: the batch's faults absorbed
    judge = batch.get("judge")
    if judge is not None:  # --judge.*: the batch's LLM-as-judge calls (never trained on)
        metrics.update({f"judge/{k}": v for k, v in judge.items() if k != "seconds"})
        metrics["judge/latency_s_mean"] = judge["seconds"] / max(judge["calls"], 1)
    metrics.update(
        {
            "timing/rollout_s": batch["end"] - batch["start"],
            "timing/rollout_start": batch["start"],
            "timing/rollout_end": batch["end"],
        }
    )
    return metrics


def _rollout_figures(trajs: list[Any], dropped: dict[str, int]) -> dict[str, float]:
    first: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    truncated: set[str] = set()
    for t in trajs:
        first.setdefault(t.rollout_id, t)
        lengths[t.rollout_id] = lengths.get(t.rollout_id, 0) + t.num_action_tokens
        if t.truncated:
            truncated.add(t.rollout_id)
    rollouts = list(first.values())
    n = max(len(rollouts), 1)
    metrics = {
        "reward_mean": sum(t.reward for t in rollouts) / n,
        "score_mean": sum((t.score if t.score is not None else t.reward) for t in rollouts) / n,
        "response_length": sum(lengths.values()) / n,
        "truncated_rate": len(truncated) / n,
        "kept_rollouts": float(len(rollouts)),
        "segments": float(len(trajs)),
        "dropped_total": float(sum(dropped.values())),
    }
    metrics.update({f"dropped/{reason}": float(count) for reason, count in dropped.items()})
    return metrics


def off_lock(batch: dict[str, Any], env_lock: dict[str, Any] | None) -> dict[str, list[str]]:
    """Per env of the run (``--env`` ID as given), the spec hashes of its kept trajectories that differ from the one
    the run's ``env_lock`` recorded (a rollout worker that resolved another version of the env); empty when all
    match. Trajectories no runner stamped (``spec_hash`` None) are not counted."""
    locked = {e["id"]: e["spec_hash"] for e in (env_lock or {}).get("envs", [])}
    found: dict[str, list[str]] = {}
    for traj, env in zip(batch["trajectories"], batch.get("trajectory_envs", []), strict=False):
        if env in locked and traj.spec_hash is not None and traj.spec_hash != locked[env]:
            found.setdefault(env, []).append(traj.spec_hash)
    return found
