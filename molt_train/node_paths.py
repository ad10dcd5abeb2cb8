"""The paths every node of a multi-node run reads, checked from every node before any actor starts.

Prompts, labels and eval rows reach the rollout workers through Ray's object store (the driver reads the dataset
files: ``RolloutWorker.set_prompts``), and so do the weights. What actors read by path cannot travel so: the
checkpoints the engines and trainer ranks load (``--actor.model_name_or_path``, ``--ref.model_name_or_path``,
``--judge.model_name_or_path``), ``--train.agent_path`` (imported by every rollout worker), ``--ckpt.output_dir``
(checkpoints, a resumed run's model, LoRA adapters) and the venv of each isolated install (its env servers run
there). They must be one shared directory (the same path on every node). ``check_every_node`` runs a probe on
every other alive node and refuses the run, naming the path, its flag and the node, where one does not see it
(``--ckpt.output_dir`` must hold the ``config.json`` the driver just wrote there: the same directory, not one of
the same name). Nodes that join after the start are not checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from molt_train.config.flags import ConfigError

if TYPE_CHECKING:
    from molt_train.config.commands import RLConfig

PROBE_TIMEOUT_S = 300  # a node's first task starts a worker process: a minute or more on a loaded machine


def shared_paths(cfg: RLConfig, installs: dict[str, Any]) -> dict[str, str]:
    """What each node must see, ``{what: path}``: the run's paths that exist here (a model name that is no local
    path is left out), ``--ckpt.output_dir``'s ``config.json``, and the python of each of ``installs``."""
    paths = {}
    for flag, value in (
        ("--actor.model_name_or_path", cfg.actor.model_name_or_path),
        ("--ref.model_name_or_path", cfg.ref.model_name_or_path),
        ("--judge.model_name_or_path", cfg.judge.model_name_or_path),
        ("--train.agent_path", cfg.train.agent_path),
    ):
        if value and Path(value).exists():
            paths[flag] = str(Path(value).resolve())
    paths["--ckpt.output_dir"] = str(Path(cfg.ckpt.output_dir).resolve() / "config.json")
    for env_id, install in installs.items():
        paths[f"the venv of {env_id} ({install.where})"] = install.python
    return paths


def missing_here(paths: dict[str, str]) -> tuple[str, list[str]]:
    """This node's IP and those of ``paths`` (``{what: path}``) it does not see."""
    import ray

    return ray.util.get_node_ip_address(), [what for what, path in paths.items() if not Path(path).exists()]


def check_every_node(paths: dict[str, str]) -> None:
    """Probe ``paths`` (``{what: path}``) on every alive node but this one (a one-node cluster: none).

    Raises:
        ConfigError: a node does not see one of them; the message names each path, what it is, and the node.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here]
    if not nodes:
        return
    probe = ray.remote(num_cpus=0)(missing_here)
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(paths)
        for node in nodes
    ]
    problems = []
    for node, (ip, missing) in zip(nodes, ray.get(refs, timeout=PROBE_TIMEOUT_S), strict=True):
        problems += [f"{paths[what]} ({what}) does not exist on node {ip} ({node[:12]})" for what in missing]
    if problems:
        raise ConfigError(
            "every node of the cluster reads these paths, but: "
            + "; ".join(problems)
            + ". Put them on a directory every node mounts at the same path (datasets need not be: their rows travel "
            "through Ray)"
        )
