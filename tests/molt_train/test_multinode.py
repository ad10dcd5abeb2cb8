"""Multi-node Ray, simulated on one machine: a real two-node cluster whose nodes have different addresses.

The head runs in one network namespace (198.51.100.1), the second raylet in another (198.51.100.2, with the
resource ``node_b``), a veth pair between them; 198.51.100.0/24 is a documentation range and no route leaves the two
namespaces, and each node has its own ``--temp-dir``, so no other Ray on this machine can join or be joined. The
driver (``molt-train rl --ray.address``) runs in the head's namespace. The run's env is an isolated install (its
own venv), so every rollout worker serves it from an ``EnvServerActor`` on its node; every episode also runs a
sandbox of the ``ray`` provider. Midway through the run the test kills every process of the second node; the run
must count that node's episodes as dropped, re-create its actors on the head node, and finish. Ray's state API
(``ray.util.state``) then says where every actor ran. The second node also has a mount namespace of its own, in
which one directory of the driver's (``driver-only``) is an empty tmpfs: a run whose checkpoint lies there is
refused before any actor starts, naming the path and the node.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from env_registry.packages.artifacts import inspect_release
from env_registry.store.local import LocalRegistry

HEAD_IP, NODE_B_IP = "198.51.100.1", "198.51.100.2"
ADDRESS = f"{HEAD_IP}:6379"
# `ray start`, patient: it gives a new raylet 30 s to register, which its agents' start-up alone exceeds on a loaded
# 2-core machine; this waits up to 3 min for the registration (the raylet's own agent timeout is raised below)
RAY_START = (
    "import sys, time\n"
    "import ray._private.services as services\n"
    "get_node = services.get_node\n"
    "def patient(*args, **kwargs):\n"
    "    deadline = time.monotonic() + 180\n"
    "    while True:\n"
    "        try:\n"
    "            return get_node(*args, **kwargs)\n"
    "        except RuntimeError:\n"
    "            if time.monotonic() > deadline:\n"
    "                raise\n"
    "            time.sleep(0.5)\n"
    "services.get_node = patient\n"
    "from ray.scripts.scripts import main\n"
    "sys.argv[0] = 'ray'\n"
    "sys.exit(main())\n"
)
RAY = [sys.executable, "-c", RAY_START]
AGENT = Path(__file__).parent / "agents" / "served_sandboxed_arith.py"
SERVED = "test/served-arith-v1"  # the agent's env, installed isolated by the test
STEPS, KILL_AFTER_STEP = 8, 2
PACKAGE = {
    "served_arith/__init__.py": '''
"""Arithmetic served from a venv of its own: molt/arith-v1's grader and tasks."""

from molt_envs.envs.arith import ArithEnv, generate_split  # noqa: F401
''',
    "pyproject.toml": f'''
[build-system]
requires = ["hatchling>=1.25"]
build-backend = "hatchling.build"

[project]
name = "served-arith"
version = "1.0.0"
requires-python = ">=3.11"
dependencies = ["molt-ecosystem"]

[project.entry-points."molt.envs"]
"{SERVED}" = "served_arith:ArithEnv"

[tool.hatch.build.targets.wheel]
packages = ["served_arith"]

[tool.hatch.build.targets.wheel.extra-metadata]
"pyproject.toml" = "molt/pyproject.toml"

[[tool.molt.env]]
id = "{SERVED}"
entry_point = "served_arith:ArithEnv"
max_turns = 1
[tool.molt.env.datasets.train]
generator = "served_arith:generate_split"
kwargs = {{ size = 256 }}
input_key = "question"
label_key = "answer"
reference_key = "answer"
[tool.molt.env.datasets.test]
generator = "served_arith:generate_split"
kwargs = {{ size = 64 }}
input_key = "question"
label_key = "answer"
''',
}

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2"
)


# each node alone in its namespace: fixed ports cannot clash with another Ray on this machine, and the raylet need
# not wait for its agents to write theirs
PORTS = ["--metrics-export-port", "8080", "--dashboard-agent-grpc-port", "8081", "--runtime-env-agent-port", "8082"]
PORTS += ["--dashboard-agent-listen-port", "52365", "--node-manager-port", "8083", "--object-manager-port", "8084"]


def sh(*cmd: str, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")
    return done


class Cluster:
    """Two network namespaces joined by a veth pair, a Ray head in one and a second raylet in the other."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns = {"a": f"molt-mn-a-{tag}", "b": f"molt-mn-b-{tag}"}
        self.dev = {"a": f"mva{tag}", "b": f"mvb{tag}"}
        self.ip = {"a": HEAD_IP, "b": NODE_B_IP}
        self.tmp = Path(tempfile.mkdtemp(prefix="molt-mn-"))  # short: Ray's socket paths live under it
        self.driver_only = self.tmp / "driver-only"  # node B sees an empty tmpfs here
        self.driver_only.mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {
            "RAY_USAGE_STATS_ENABLED": "0",
            # nothing outside the two namespaces can reach this cluster: no token to share between its nodes
            "RAY_AUTH_MODE": "disabled",
            # a loaded 2-core machine registers a node's agents in ~1 min; the default gives them 30 s
            "RAY_agent_register_timeout_ms": "180000",
        }

    def exec(self, side: str, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[side], *cmd]

    def start_node(self, side: str, *flags: str, hide: Path | None = None) -> None:
        """``ray start`` in ``side``'s namespace (with ``hide``: in a mount namespace of its own, where an empty
        tmpfs covers that directory). A raylet waits a fixed 15 s for its agents' port files, which a loaded 2-core
        machine can exceed: the node starts at a raised priority, then drops back to the default."""
        start = [*RAY, "start", *flags]
        if hide is not None:
            start = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs tmpfs "$0" && exec "$@"', str(hide), *start]
        sh("nice", "-n", "-19", *self.exec(side, *start), env=self.env, timeout=300)
        for pid in sh("ip", "netns", "pids", self.ns[side]).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, int(pid), 0)

    def start(self) -> None:
        for side in "ab":
            sh("ip", "netns", "add", self.ns[side])
        sh("ip", "link", "add", self.dev["a"], "type", "veth", "peer", "name", self.dev["b"])
        for side in "ab":
            ns, dev = self.ns[side], self.dev[side]
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{self.ip[side]}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            # a default route over the veth: Ray finds each node's address by the route out; nothing forwards it on
            sh("ip", "-n", ns, "route", "add", "default", "dev", dev)
        common = ["--object-store-memory", str(100 << 20), "--disable-usage-stats", *PORTS]
        self.start_node(
            "a",
            "--head",
            "--node-ip-address",
            HEAD_IP,
            "--port",
            "6379",
            "--temp-dir",
            str(self.tmp / "a"),
            "--num-cpus",
            "2",
            "--dashboard-host",
            "127.0.0.1",
            *common,
        )
        self.start_node(
            "b",
            "--address",
            ADDRESS,
            "--node-ip-address",
            NODE_B_IP,
            "--temp-dir",
            str(self.tmp / "b"),
            "--num-cpus",
            "1",
            "--resources",
            '{"node_b": 1}',
            *common,
            hide=self.driver_only,
        )

    def kill(self, side: str) -> list[int]:
        """SIGKILL every process in ``side``'s namespace (its Ray node and all it started); returns their pids."""
        if self.ns[side] not in sh("ip", "netns", "list").stdout:
            return []
        pids = [int(p) for p in sh("ip", "netns", "pids", self.ns[side]).stdout.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # already gone
                os.kill(pid, signal.SIGKILL)
        return pids

    def close(self) -> None:
        for side in "ba":
            self.kill(side)
        for side in "ab":  # deleting a namespace deletes its end of the veth pair, and with it the pair
            subprocess.run(["ip", "netns", "del", self.ns[side]], capture_output=True)
        subprocess.run(["ip", "link", "del", self.dev["a"]], capture_output=True)  # if it never moved
        shutil.rmtree(self.tmp, ignore_errors=True)

    def state(self) -> dict:
        """Nodes and actors of the cluster, from Ray's state API (queried from the head's namespace)."""
        script = (
            "import json; from ray.util.state import list_actors, list_nodes\n"
            "nodes = [{'id': n.node_id, 'ip': n.node_ip, 'state': n.state} for n in list_nodes()]\n"
            "actors = [{'cls': a.class_name, 'node': a.node_id, 'state': a.state, 'pid': a.pid, 'id': a.actor_id,"
            " 'death': str(a.death_cause)[:400]}"
            " for a in list_actors(limit=10000, raise_on_missing_output=False, detail=True)]\n"
            "print(json.dumps({'nodes': nodes, 'actors': actors}))\n"
        )
        out = sh(*self.exec("a", sys.executable, "-c", script), env=self.env | {"RAY_ADDRESS": ADDRESS}, timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def model_dir(tiny_tokenizer, tiny_model, tmp_path_factory) -> str:
    from molt_train.models.tiny import save_tiny

    return str(save_tiny(tiny_model, tiny_tokenizer, tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def molt_cache(tmp_path_factory) -> Path:
    """A ``$MOLT_CACHE`` holding ``SERVED`` installed isolated (real venv, real pip) from a local registry."""
    from hatchling.builders.sdist import SdistBuilder
    from hatchling.builders.wheel import WheelBuilder

    root = tmp_path_factory.mktemp("served")
    for name, text in PACKAGE.items():
        (root / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / name).write_text(text.lstrip())
    (root / "dist").mkdir()
    wheel = next(WheelBuilder(str(root / "src")).build(directory=str(root / "dist"), versions=["standard"]))
    sdist = next(SdistBuilder(str(root / "src")).build(directory=str(root / "dist"), versions=["standard"]))
    LocalRegistry(root / "registry").publish(inspect_release(Path(wheel), Path(sdist)))
    molt_env = str(Path(sys.executable).with_name("molt-env"))
    cmd = [molt_env, "install", "--isolated", "--registry", str(root / "registry"), SERVED]
    sh(*cmd, env=os.environ | {"MOLT_CACHE": str(root / "cache")}, timeout=600)
    return root / "cache"


def rl_command(model: str, out: Path) -> list[str]:
    return [
        *("-m", "molt_train.cli", "rl", "--ray.address", ADDRESS, "--env", SERVED),
        *("--train.agent_path", str(AGENT), "--actor.model_name_or_path", model, "--ckpt.output_dir", str(out)),
        *("--rollout.num_workers", "2", "--rollout.batch_size", "8", "--rollout.max_new_tokens", "4"),
        *("--train.num_steps", str(STEPS), "--eval.max_samples", "4", "--no-logger.progress"),
    ]


def test_a_checkpoint_only_the_driver_sees_is_refused_naming_it_and_the_node(cluster, model_dir, molt_cache, tmp_path):
    hidden = cluster.driver_only / "model"
    shutil.copytree(model_dir, hidden)
    cmd = cluster.exec("a", sys.executable, *rl_command(str(hidden), tmp_path / "run"))
    done = subprocess.run(cmd, capture_output=True, text=True, env=cluster.env | {"MOLT_CACHE": str(molt_cache)})
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert f"{hidden} (--actor.model_name_or_path) does not exist on node {NODE_B_IP}" in out, out[-3000:]
    assert out.count("does not exist on node") == 1, out[-3000:]  # the rest (output dir, agent, venv) is shared
    print(out.strip().splitlines()[-1])
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before anything ran


@pytest.fixture(scope="module")
def killed_run(cluster, model_dir, molt_cache, tmp_path_factory):
    """``molt-train rl`` on the cluster with two rollout workers; node B is killed once step KILL_AFTER_STEP is
    logged."""
    out = tmp_path_factory.mktemp("rl")
    log = (out / "driver.log").open("w")
    driver = subprocess.Popen(
        cluster.exec("a", sys.executable, *rl_command(model_dir, out)),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=cluster.env | {"MOLT_CACHE": str(molt_cache)},
    )
    metrics = out / "metrics.jsonl"
    try:
        while driver.poll() is None and len(lines(metrics)) < KILL_AFTER_STEP:
            time.sleep(0.1)
        # a step takes ~0.15 s and the state API seconds: the driver (``ip netns exec`` execs it: this pid) holds
        # still while every actor is read alive (the state API may lose a dead node's records) and node B is killed,
        # so the kill comes right after step KILL_AFTER_STEP and the run has steps left to recover in
        os.kill(driver.pid, signal.SIGSTOP)
        try:
            killed_at = len(lines(metrics))
            before = cluster.state()
            killed = cluster.kill("b")
        finally:
            os.kill(driver.pid, signal.SIGCONT)
        rc = driver.wait(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
        log.close()
    assert rc == 0, (out / "driver.log").read_text()[-4000:]
    # the state API keeps the dead: every actor with the node it ran on, node B's among them
    state = cluster.state()
    return {
        "out": out,
        "before": before,
        "state": state,
        "killed": killed,
        "killed_at": killed_at,
        "metrics": lines(metrics),
    }


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def placement(state: dict, cls: str) -> list[str]:
    """The IP of the node each ``cls`` actor ran on (alive or dead)."""
    ips = {n["id"]: n["ip"] for n in state["nodes"]}
    return [ips.get(a["node"], "?") for a in actors(state, cls)]


def actors(state: dict, cls: str) -> list[dict]:
    return [a for a in state["actors"] if a["cls"] == cls]


def test_the_two_nodes_have_different_addresses(killed_run):
    assert {n["ip"]: n["state"] for n in killed_run["state"]["nodes"]} == {HEAD_IP: "ALIVE", NODE_B_IP: "DEAD"}


def test_rollout_workers_env_servers_and_sandbox_actors_ran_on_both_nodes(killed_run):
    state = killed_run["state"]
    workers = placement(state, "RolloutWorker")
    assert set(workers) == {HEAD_IP, NODE_B_IP}, workers  # --rollout.num_workers 2: one per node
    servers = placement(state, "EnvServerActor")
    # each rollout worker's env server, on its node (the message: every record, to tell a misplaced actor from one
    # the state API lost)
    assert set(servers) == {HEAD_IP, NODE_B_IP}, (servers, state["nodes"], actors(state, "EnvServerActor"))
    # the sandbox ray provider spreads too: seen before the kill (afterwards all five have once shown on the head,
    # node B's records lost)
    sandboxes = placement(killed_run["before"], "_SandboxActor")
    assert {HEAD_IP, NODE_B_IP} <= set(sandboxes), (sandboxes, actors(killed_run["before"], "_SandboxActor"))
    assert set(placement(state, "PolicyWorker")) == {HEAD_IP}  # the CPU trainer rank stays by the driver


def test_a_lost_node_drops_its_episodes_and_its_actors_come_back_on_the_survivor(killed_run):
    assert killed_run["killed"]  # the second node's raylet and workers were there to kill
    assert killed_run["killed_at"] == KILL_AFTER_STEP  # the driver held still: the run had steps left to recover in
    state = killed_run["state"]
    workers = placement(state, "RolloutWorker")
    assert sorted(workers) == [HEAD_IP, HEAD_IP, NODE_B_IP], workers  # the lost worker, re-created on the head
    servers = placement(state, "EnvServerActor")
    # the driver's (it reads the env's datasets from it), one per rollout worker: the lost one's re-created with it
    assert sorted(servers) == [HEAD_IP, HEAD_IP, HEAD_IP, NODE_B_IP], (servers, actors(state, "EnvServerActor"))
    metrics = killed_run["metrics"]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))  # the run finished
    lost = sum(m.get("rollout/dropped/rollout_worker_lost", 0) for m in metrics)
    assert 0 < lost <= 8, lost  # one worker's part of a batch or two: its episodes, counted
    for m in metrics:  # every episode is accounted for: kept or dropped with a reason
        assert m["rollout/kept_rollouts"] + m["rollout/dropped_total"] == m["rollout/num_rollouts"] == 8
    # sandbox calls to the lost node's actors fail as failure_sandbox, never as reward 0; the replacements on the
    # head node serve the last steps whole
    dropped = [{k: v for k, v in m.items() if k.startswith("rollout/dropped/") and v} for m in metrics]
    assert [m["rollout/dropped_total"] for m in metrics[-2:]] == [0, 0], dropped
    assert (killed_run["out"] / "hf" / "config.json").is_file()
    for cls in ("RolloutWorker", "EnvServerActor", "_SandboxActor", "PolicyWorker"):  # for the record (-rP)
        print(cls, sorted(placement(state, cls)))
