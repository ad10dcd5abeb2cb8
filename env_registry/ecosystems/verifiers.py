"""verifiers (Prime Intellect, ``verifiers.v1``): every taskset package installed in the verifiers venv as
``verifiers:MODULE``, a ChatAgent whose rollout is verifiers' own.

verifiers 0.4 pins ``openai`` and ``mcp`` versions this project's venv cannot take, so it lives in a venv of its own,
``$MOLT_CACHE/ecosystems/verifiers/venv``, made by ``molt-env ecosystem install verifiers --with TASKSET_PACKAGE``
(``make_venv``: ``verifiers==0.4.0``, this project's env runtime and the taskset packages). Its version and the
tasksets it holds are read by running that venv's python (``probe``), never imported here; every env runs in an env
server under that python.

``verifiers:MODULE?key=value&...``: keys of the agent seat (``AGENT_KEYS``: ``harness`` (id), ``runtime`` (a runtime
config), ``max_turns``, ...) go to the env config's ``agent``, every other key to the taskset's config. They are
checked against verifiers' own config classes in the env server, which refuses to start on a bad one.

The env (``VerifiersAgent``) runs one task row through verifiers' own rollout loop, as verifiers' env server does:
``Env.run_slot`` over the row's ``TaskData`` (its label), the agent's harness (the taskset's own, else verifiers'
tool-less chat loop ``null``) in a local subprocess runtime, its model client pointed at ``ctx.base_url``, so every
model call of the rollout passes through the session server and is captured token-exactly. It returns the rubric's
reward (the trace's weighted rewards) with the trace's metrics. Dataset rows (``task_rows``) are the taskset's tasks.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from env_registry.ecosystems.adapter import Adapter, MissingLibrary
from env_registry.errors import Error, NameNotFound
from env_registry.installs.isolated import cache_dir, runtime_requirement
from env_registry.installs.pip import pip_install
from env_registry.sources import CatalogEntry
from molt_envs.contract import ChatAgent, ChatContext, Result

VERSION = "0.4.0"
REQUIREMENTS = (f"verifiers=={VERSION}", "uv>=0.7")  # uv: verifiers' harnesses run their programs as uv scripts
INSTALL = "molt-env ecosystem install verifiers --with TASKSET_PACKAGE"
ENTRY_POINT = "env_registry.ecosystems.verifiers:VerifiersAgent"
GENERATOR = "env_registry.ecosystems.verifiers:task_rows"
# the agent seat's knobs (verifiers.v1.AgentConfig, less model, client and sampling: the run's own)
AGENT_KEYS = ("harness", "runtime", "max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "timeout")
DEFAULT_HARNESS = "null"  # verifiers' tool-less chat loop, for a taskset that bundles no harness of its own
MAX_INFINITE_ROWS = 10_000  # rows read from a taskset whose load() never ends
PROBE_TIMEOUT_S = 60
# run by the venv's python: verifiers' version and the distributions that depend on it, with their top-level modules
PROBE = r"""
import importlib.metadata as m, json, re
out = {"verifiers": None, "tasksets": {}}
try:
    out["verifiers"] = m.version("verifiers")
except m.PackageNotFoundError:
    pass
needs = re.compile(r"verifiers\s*(\[[^\]]*\])?\s*([<>=!~(;]|$)", re.I)
for dist in m.distributions():
    name = dist.metadata["Name"] or ""
    if name.lower() == "verifiers" or not any(needs.match(r) and "extra ==" not in r for r in dist.requires or []):
        continue
    tops = (dist.read_text("top_level.txt") or "").split()
    tops = tops or sorted({f.parts[0] for f in dist.files or [] if len(f.parts) == 2 and f.parts[1] == "__init__.py"}
                          | {f.stem for f in dist.files or [] if len(f.parts) == 1 and f.suffix == ".py"})
    for top in tops:
        info = {"package": name, "version": dist.version, "summary": dist.metadata["Summary"] or "",
                "license": dist.metadata["License-Expression"] or dist.metadata["License"] or ""}
        out["tasksets"][top] = info
print(json.dumps(out))
"""
_PROBED: dict[tuple[str, int], dict[str, Any]] = {}


def venv_dir() -> Path:
    return cache_dir() / "ecosystems" / "verifiers" / "venv"


def make_venv(packages: Sequence[str] = ()) -> float:
    """Make (or update) the verifiers venv: ``verifiers==0.4.0``, this project's env runtime and ``packages`` (pip
    requirements or local paths: the taskset packages); returns the seconds it took.

    Raises:
        InstallError, IsolatedInstallError: creating the venv, building the runtime or pip failed.
    """
    start = time.monotonic()
    venv = venv_dir()
    python = venv / "bin" / "python"
    existed = python.is_file()
    if not existed:
        venv.parent.mkdir(parents=True, exist_ok=True)
        # without pip of its own (this interpreter's pip installs into it): a venv in half a second
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    local = [str(Path(p).resolve()) for p in packages if Path(p).exists()]
    given = [p for p in packages if not Path(p).exists()] + local
    what = f"verifiers {VERSION} and {', '.join(packages) or 'no taskset package'} into {venv}"
    runtime = runtime_requirement()
    pip_install([runtime, *REQUIREMENTS, *given], what, into=str(python))
    if existed:  # pip keeps an installed version it is given again: this checkout's runtime and local packages win
        pip_install(["--no-deps", "--force-reinstall", runtime, *local], what, into=str(python))
    return time.monotonic() - start


def probe() -> dict[str, Any]:
    """``{"verifiers": version or None, "tasksets": {module: {package, version, summary, license}}}`` as the venv's
    python reads them (cached until the venv's site-packages change).

    Raises:
        MissingLibrary: there is no verifiers venv, or verifiers is not installed in it.
    """
    python = venv_dir() / "bin" / "python"
    site = sorted(venv_dir().glob("lib/python*/site-packages"))
    if not python.is_file() or not site:
        raise MissingLibrary(
            f"the verifiers: scheme runs verifiers in a venv of its own, which is not made yet ({venv_dir()} "
            f"does not exist); make it with `{INSTALL}`"
        )
    key = (str(python), site[0].stat().st_mtime_ns)
    if key not in _PROBED:
        try:
            proc = subprocess.run(
                [str(python), "-I", "-c", PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
            )
            found = json.loads(proc.stdout) if proc.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError):
            found = None
        if found is None:
            raise MissingLibrary(f"the verifiers venv's python {python} does not run; remake the venv with `{INSTALL}`")
        if found["verifiers"] is None:
            raise MissingLibrary(f"verifiers is not installed in {venv_dir()}; install it with `{INSTALL}`")
        _PROBED[key] = found
    return _PROBED[key]


class Verifiers(Adapter):
    scheme = "verifiers"
    library = "verifiers"
    module = "verifiers"
    extra = "verifiers"
    license = "MIT"

    def python(self) -> str:
        return str(venv_dir() / "bin" / "python")

    def version(self) -> str:
        return probe()["verifiers"]

    def names(self) -> list[str]:
        return sorted(probe()["tasksets"])

    def split(self, env_id: str) -> tuple[str, dict[str, Any]]:
        """``verifiers:owner/my-taskset@1.0`` names module ``my_taskset``, as verifiers' own loader reads an ID."""
        name, kwargs = super().split(env_id)
        return name.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower(), kwargs

    def check_name(self, name: str) -> None:
        try:
            super().check_name(name)
        except NameNotFound as exc:
            raise NameNotFound(
                f"{exc} {name!r} is not a taskset package installed in the verifiers venv ({venv_dir()}); install "
                f"yours with `{INSTALL}`"
            ) from None

    def catalog(self) -> list[CatalogEntry]:
        return [
            CatalogEntry(f"verifiers:{name}", "chat_agent", True, "", f"{t['package']} {t['version']}: {t['summary']}")
            for name, t in sorted(probe()["tasksets"].items())
        ]

    def build(self, name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        if "split" in kwargs:
            raise ValueError("'split' is not a kwarg: the train and test splits set the taskset's split field")
        agent = {k: v for k, v in kwargs.items() if k in AGENT_KEYS}
        config = {k: v for k, v in kwargs.items() if k not in AGENT_KEYS}
        if Path(sys.prefix).resolve() == venv_dir().resolve():  # the env server: verifiers' config classes check them
            _env_config(name, config, agent)
        taskset = probe()["tasksets"][name]
        return {
            "entry_point": ENTRY_POINT,
            "kind": "chat_agent",
            "description": f"verifiers taskset {name} ({taskset['package']}): {taskset['summary']}".rstrip(": "),
            "tags": ["verifiers", "chat-agent", "text"],
            "license": taskset["license"] or None,
            "package": taskset["package"],
            "package_version": taskset["version"],
            "max_turns": agent.get("max_turns"),
            "kwargs": {"taskset": name, "config": config, "agent": agent},
            "datasets": {split: {"generator": GENERATOR, "env_kwargs": True} for split in ("train", "test")},
            "card": {
                "source": f"the tasks of verifiers taskset {name} ({taskset['package']} {taskset['version']})",
                "license": taskset["license"] or "unknown (see the taskset package)",
                "held_out": "the taskset's own 'split' config field (train / test) where it has one; else none: "
                "both splits are all of its tasks",
            },
        }

    def install(self, packages: Sequence[str]) -> str:
        """``molt-env ecosystem install verifiers --with ...``: make the venv; returns what to print."""
        seconds = make_venv(packages)
        names = ", ".join(f"verifiers:{n}" for n in self.names()) or "none yet (add one with --with)"
        return f"verifiers {self.version()} venv at {venv_dir()} ({seconds:.1f} s); tasksets: {names}"


SOURCE = Verifiers()


# -- in the env server (the verifiers venv) --
def _env_config(name: str, config: dict[str, Any], agent: dict[str, Any]) -> Any:
    """The verifiers ``EnvConfig`` of taskset ``name`` with the ID's kwargs; ``ValueError`` naming a bad key."""
    from pydantic import ValidationError
    from verifiers.v1 import AgentConfig
    from verifiers.v1.utils.loaders import default_harness_id, resolve_env_config, taskset_config_type

    try:
        fields = taskset_config_type(name).model_fields
    except (ImportError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"{name!r} is not a verifiers taskset: {exc}") from None
    for key in config:
        if key not in fields or key in ("id", "split"):
            settable = sorted(set(fields) - {"id", "split"})
            raise ValueError(
                f"verifiers taskset {name}'s config has no field {key!r} to set; its fields: {', '.join(settable)} "
                f"(and the agent's: {', '.join(AGENT_KEYS)})"
            )
    seat = dict(agent)
    if "harness" in seat and seat["harness"] is None:  # ?harness=null: the ID's value parsed as JSON
        seat["harness"] = DEFAULT_HARNESS
    if isinstance(seat.get("harness"), str):
        seat["harness"] = {"id": seat["harness"]}
    if "harness" not in seat and default_harness_id(name) == "bash":  # no harness of the taskset's own
        seat["harness"] = {"id": DEFAULT_HARNESS}
    seat.setdefault("runtime", {"type": "subprocess"})
    try:
        return resolve_env_config({"taskset": {"id": name, **config}, "agent": seat})
    except (ValidationError, ValueError, TypeError, ModuleNotFoundError) as exc:
        known = ", ".join(k for k in AgentConfig.model_fields if k in AGENT_KEYS)
        raise ValueError(
            f"verifiers rejects {config | agent} for taskset {name} (agent keys: {known}): {exc}"
        ) from None


def task_rows(
    split: str, taskset: str, config: dict[str, Any] | None = None, agent: dict[str, Any] | None = None
) -> Iterator[dict[str, Any]]:
    """The dataset rows of ``split``: each task's prompt as chat messages, its ``TaskData`` (JSON) as the label."""
    from itertools import islice

    from verifiers.v1.dialects.chat import message_to_wire
    from verifiers.v1.utils.loaders import load_taskset, taskset_config_type

    cls = taskset_config_type(taskset)
    values = {"id": taskset, **(config or {}), **({"split": split} if "split" in cls.model_fields else {})}
    tasks = load_taskset(cls.model_validate(values))
    for task in islice(tasks, None if tasks.bounded else MAX_INFINITE_ROWS):
        data = task.data
        if data.prompt is None:
            raise Error(f"verifiers taskset {taskset} task {data.idx} has no prompt (the user opens it): not supported")
        prompt = [{"role": "user", "content": data.prompt}] if isinstance(data.prompt, str) else data.prompt
        messages = [m if isinstance(m, dict) else message_to_wire(m) for m in prompt]
        if data.system_prompt:
            messages.insert(0, {"role": "system", "content": data.system_prompt})
        yield {"prompt": messages, "label": data.model_dump(mode="json")}


_ENVS: dict[str, tuple[Any, Any]] = {}  # config JSON -> (verifiers Env, the exit stack holding it serving)
_ENV_LOCK: asyncio.Lock | None = None


async def _serving_env(taskset: str, config: dict[str, Any], agent: dict[str, Any]) -> Any:
    """One verifiers ``Env`` per config and process, loaded on first use and kept serving for the process's life (as
    verifiers' own env server keeps its one)."""
    global _ENV_LOCK
    key = json.dumps([taskset, config, agent], sort_keys=True)
    _ENV_LOCK = _ENV_LOCK or asyncio.Lock()
    async with _ENV_LOCK:
        if key not in _ENVS:
            from contextlib import AsyncExitStack

            from verifiers.v1.utils.loaders import load_environment

            here = str(Path(sys.executable).parent)  # the venv's uv, which verifiers' harness programs run under
            if here not in os.environ.get("PATH", "").split(os.pathsep):
                os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
            env = await asyncio.to_thread(load_environment, _env_config(taskset, config, agent))
            stack = AsyncExitStack()  # kept with the env: collected, it would close env.serving()
            await stack.enter_async_context(env.serving())  # left open: it ends with the process
            _ENVS[key] = env, stack
    return _ENVS[key][0]


class VerifiersRolloutError(RuntimeError):
    """verifiers ended the rollout with an error (its harness, the model call or the rubric failed)."""


class VerifiersAgent(ChatAgent):
    """One task row through verifiers' own rollout loop, its model calls sent to ``ctx.base_url`` (module docstring).

    Args:
        taskset: the taskset's module. config: its config fields. agent: the agent seat's (``AGENT_KEYS``).
    """

    def __init__(self, taskset: str, config: dict[str, Any] | None = None, agent: dict[str, Any] | None = None):
        self.taskset, self.config, self.agent = taskset, dict(config or {}), dict(agent or {})

    async def run(self, ctx: ChatContext) -> Result:
        import verifiers.v1 as vf

        env = await _serving_env(self.taskset, self.config, self.agent)
        task_cls = type(env.taskset).task_type()
        task = task_cls(task_cls.data_type().model_validate(ctx.label), env.config.taskset.task)
        params = ctx.sampling_params
        model = vf.ModelContext(
            model=ctx.model_name,
            client=vf.EvalClientConfig(base_url=ctx.base_url, api_key_var="MOLT_VERIFIERS_API_KEY"),
            sampling=vf.SamplingConfig(
                temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens
            ),
        )
        (slot,) = env.slots(task)
        episode = await env.run_slot(slot, model)
        if not episode.ok or not episode.traces:
            error = episode.last_error or next((t.last_error for t in episode.traces if t.last_error), None)
            why = f"{error.type}: {error.message}" if error else "no trace"
            raise VerifiersRolloutError(f"verifiers taskset {self.taskset}, task {task.data.idx}: {why}")
        info: dict[str, Any] = {"turns": sum(t.num_turns for t in episode.traces)}
        for trace in episode.traces:
            info.update({k: v for k, v in trace.metrics.items() if v is not None})
            info.update({f"reward/{k}": r.score for k, r in trace.rewards.items() if r is not None})
        return Result(reward=sum(t.reward for t in episode.traces) / len(episode.traces), info=info)
