"""Chaos: one CPU RL run under injected faults, then a check from the OS that nothing of it is left.

    .venv/bin/python benchmarks/chaos_bench.py [--seed 0] [--steps 8] [--prompts 128] [--samples 4] [--rounds 2]
                                               [--timeout-s 120]

The run is ``molt-train rl`` as a user starts it (its own process tree, its own ``TMPDIR``) on a tiny model SFT'd to
call the ``python_executor`` tool (each call sleeps 0.2 s in its jail), over a mix of four envs: ``molt/python-tool-v1``
(sandboxed tool calls), ``molt/chat-python-tool-v1`` (a ChatAgent: the OpenAI SDK against the rollout worker's session
server, tool calls sandboxed), ``rg:products`` (reasoning-gym, served: its own ``serve-env`` process) and
``molt/tictactoe-v1`` (a two-seat game). ``--prompts`` x ``--samples`` episodes a step, ``--rollout.timeout_s`` the
episode deadline. While it runs, a fault injector (seeded: ``--seed`` replays the plan) strikes each fault ``--rounds``
times, at random steps, a random moment after the step's rollout began and once the target is busy:

- ``env_server_kill``: SIGKILL the served env's server while it holds episodes;
- ``sandbox_worker_kill``: SIGKILL a sandbox worker (its jail goes with it) while tool calls run;
- ``env_server_stop``: SIGSTOP the served env's server, never resumed (a wedged server: its sockets stay open);
- ``session_cut``: cut the session server's TCP connections mid-turn (``ss -K``, the kernel resets them), again
  and again for ``CUT_BURST_S`` (a ChatAgent's connection is idle while its tool call runs).

Checks (the exit status is 1 if one fails): the run finishes every step; each fault is counted in its step's metrics
(``env_server_*``: the served env's dropped episodes, ``rollout/rg:products/dropped/<reason>``; ``sandbox_worker_kill``:
``sandbox/retries`` + ``sandbox/infra_errors``; ``session_cut``: the SDK's retries answered by replay,
``session/replays``, or the ChatAgent's dropped episodes); no step's rollout outlasts the deadline plus
``MARGIN_S``; after the run exits, no process of it is alive, no cgroup of its jails remains, nothing is left in its
``TMPDIR`` but what Ray and torch keep on purpose (``KEPT_BY_DESIGN``), and none of the ports it listened on is
still held by a process of it. Figures: steps lost per fault (the goal: 0), episodes dropped per fault, the longest
rollout against the deadline.

``--smoke`` (what ``make test`` runs, tests/test_benchmarks_smoke.py): each fault once over 4 steps of 64 episodes,
the same checks; about two minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

BIN = Path(sys.executable).parent
SERVED = "rg:products"
ENVS = ("molt/python-tool-v1:2", "molt/chat-python-tool-v1:1", f"{SERVED}:1", "molt/tictactoe-v1:1")
FAULTS = ("env_server_kill", "sandbox_worker_kill", "env_server_stop", "session_cut")
CALL = '<tool_call>\n{"name": "python_executor", "arguments": {"code": "import time;time.sleep(0.2)"}}\n</tool_call>'
KEPT_BY_DESIGN = ("ray", "torchinductor_")  # Ray's session logs and torch's compile cache outlive a run on purpose
MARGIN_S = 15.0  # a step's rollout may outlast the episode deadline by this much (cleanup, a loaded 2-core machine)
CUT_BURST_S = 2.0  # how long the session server's connections are cut, again and again
GRACE_S = 30.0  # how long after the run's exit its processes may take to be gone


@dataclass
class Strike:
    fault: str
    step: int
    delay_s: float
    done: str = ""  # what was hit, once struck


@dataclass
class Watch:
    """The run's process tree as seen every 0.05 s, and the faults struck at it."""

    root: psutil.Process
    metrics: Path
    plan: list[Strike]
    seen: dict[tuple[int, float], str] = field(default_factory=dict)  # (pid, create time) -> command line
    ports: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def steps_done(self) -> int:
        return len(self.metrics.read_text().splitlines()) if self.metrics.exists() else 0

    def tree(self) -> tuple[list[psutil.Process], list]:
        """The run's processes now, and every TCP socket of the host (one read of /proc for all)."""
        procs = []
        for proc in [self.root, *self.root.children(recursive=True)]:
            try:
                self.seen.setdefault((proc.pid, proc.create_time()), " ".join(proc.cmdline())[:200])
                procs.append(proc)
            except psutil.Error:
                continue
        conns = psutil.net_connections("tcp")
        pids = {p.pid for p in procs}
        self.ports.update(c.laddr.port for c in conns if c.status == "LISTEN" and c.pid in pids)
        return procs, conns

    def run(self, stop: threading.Event) -> None:
        pending = sorted(self.plan, key=lambda s: s.step)
        began: dict[int, float] = {}
        while not stop.is_set():
            procs, conns = self.tree()
            step = self.steps_done() + 1  # the step whose rollout runs (synchronous mode)
            began.setdefault(step, time.monotonic())
            while pending and pending[0].step < step:  # its step went by before a target was busy
                missed = pending.pop(0)
                self.errors.append(f"{missed.fault} at step {missed.step}: no busy target during the step")
            if pending and pending[0].step == step and time.monotonic() - began[step] >= pending[0].delay_s:
                with contextlib.suppress(psutil.Error):  # the target went away meanwhile: try again
                    pending[0].done = strike(pending[0].fault, procs, conns)
                if pending[0].done:
                    pending.pop(0)
            stop.wait(0.05)


def named(procs: list[psutil.Process], *parts: str) -> list[psutil.Process]:
    found = []
    for proc in procs:
        try:
            line = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if all(p in line for p in parts):
            found.append(proc)
    return found


def rollout_worker(procs: list[psutil.Process]) -> psutil.Process | None:
    workers = [p for p in procs if p.name().startswith("ray::RolloutWor")] or named(procs, "ray::RolloutWorker")
    return workers[0] if workers else None


def strike(fault: str, procs: list[psutil.Process], conns: list) -> str:
    """Hit ``fault``'s target if one is busy now; what was hit ("" for nothing yet)."""
    worker = rollout_worker(procs)
    if worker is None:
        return ""
    if fault.startswith("env_server"):
        for server in named(worker.children(), "serve-env", SERVED):
            busy = any(c.pid == server.pid and c.status == "ESTABLISHED" for c in conns)  # it holds episodes now
            if busy and server.status() != psutil.STATUS_STOPPED:
                server.send_signal(signal.SIGKILL if fault == "env_server_kill" else signal.SIGSTOP)
                return f"pid {server.pid}"
        return ""
    if fault == "sandbox_worker_kill":
        for launcher in named(worker.children(), "sandboxes/launcher.py"):
            if any(sleeping(p) for p in launcher.children(recursive=True)):  # its jail runs a call now
                launcher.kill()
                return f"pid {launcher.pid}"
        return ""
    port = session_port(worker)
    if port is None or not any(c.raddr and c.raddr.port == port for c in conns):
        return ""
    n, end = 0, time.monotonic() + CUT_BURST_S  # a connection is idle between a ChatAgent's calls: cut for a while
    while time.monotonic() < end:
        cut = subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", str(port)], capture_output=True, text=True)
        n += max(0, len(cut.stdout.splitlines()) - 1)
        time.sleep(0.2)
    return f"{n} connection(s) to port {port}" if n else ""


def sleeping(proc: psutil.Process) -> bool:
    """Whether ``proc`` sleeps in ``time.sleep`` (a jail running ``CALL``'s snippet; an idle jail waits on a pipe)."""
    try:
        return "nanosleep" in Path(f"/proc/{proc.pid}/wchan").read_text()
    except OSError:
        return False


def session_port(worker: psutil.Process) -> int | None:
    """The rollout worker's session server: the port of its that answers ``/health`` as the policy's server."""
    for conn in worker.net_connections("tcp"):
        if conn.status != "LISTEN":
            continue
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{conn.laddr.port}/health", timeout=0.5) as reply:
                if json.loads(reply.read()).get("model") == "policy":
                    return conn.laddr.port
        except (OSError, ValueError, http.client.HTTPException):  # another server of the worker (Ray's gRPC)
            continue
    return None


def sft_start(out: Path, steps: int) -> Path:
    """A tiny model that calls the tool: SFT on ``molt/python-tool-v1``'s prompts (with its tool preamble, as the
    model reads it) to one fixed call, ``CALL``."""
    import env_registry
    from molt_envs.envs.python_tool import SYSTEM_PROMPT
    from molt_envs.tools import PYTHON_EXECUTOR
    from molt_train.models.tiny import train_tokenizer

    template = train_tokenizer(["x"], vocab_size=300)  # the tiny models' chat template renders the tools
    system = template.apply_chat_template(
        [{"role": "system", "content": SYSTEM_PROMPT}], tools=[PYTHON_EXECUTOR], tokenize=False
    )
    system = system.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0]
    rows = out / "sft.jsonl"
    with rows.open("w") as f:
        for row in env_registry.load_split(env_registry.spec("molt/python-tool-v1"), "train", 64):
            prompt = [{"role": "system", "content": system}, *row["prompt"]]
            f.write(json.dumps({"input": prompt, "label": row["label"], "output": CALL}) + "\n")
    cmd = [str(BIN / "molt-train"), "sft", "--env", "molt/python-tool-v1", "--data.prompt_dataset", str(rows)]
    cmd += ["--model.config", "tiny", "--model.role_tokens", "--model.vocab_size", "4096", "--model.hidden_size", "64"]
    cmd += ["--train.num_steps", str(steps), "--train.batch_size", "16", "--actor.adam.lr", "1e-2"]
    cmd += ["--data.max_len", "1024", "--eval.max_samples", "0", "--ckpt.output_dir", str(out / "sft")]
    subprocess.run([*cmd, "--no-logger.progress"], check=True, capture_output=True, text=True)
    return out / "sft" / "hf"


def rl_command(start: Path, out: Path, args: argparse.Namespace) -> list[str]:
    cmd = [str(BIN / "molt-train"), "rl", *(a for env in ENVS for a in ("--env", env))]
    cmd += [
        "--actor.model_name_or_path",
        str(start),
        "--ckpt.output_dir",
        str(out),
        "--train.num_steps",
        str(args.steps),
    ]
    cmd += ["--rollout.batch_size", str(args.prompts), "--rollout.n_samples_per_prompt", str(args.samples)]
    cmd += ["--rollout.max_new_tokens", "48", "--data.max_len", "1024", "--rollout.timeout_s", str(args.timeout_s)]
    cmd += ["--algo.advantage.estimator", "grpo", "--train.force_sync_mode", "--eval.max_samples", "0"]
    return [*cmd, "--train.seed", str(args.seed), "--ray.num_cpus", "2", "--no-logger.progress"]


def counted(fault: str, m: dict[str, float]) -> float:
    """How many of ``fault``'s episodes (or calls) step metrics ``m`` counted."""
    if fault.startswith("env_server"):  # its episodes lost with the connection or (no heartbeat) at the deadline
        return sum(v for k, v in m.items() if k.startswith(f"rollout/{SERVED}/dropped/"))
    if fault == "sandbox_worker_kill":
        return m.get("sandbox/retries", 0) + m.get("sandbox/infra_errors", 0)
    return m.get("session/replays", 0) + m.get("rollout/molt/chat-python-tool-v1/dropped_total", 0)


def leftovers(watch: Watch, tmp: Path) -> list[str]:
    """What of the run is still there, from the OS: processes, jail cgroups, temp files, listening ports."""
    deadline = time.monotonic() + GRACE_S
    alive = [1]
    while alive and time.monotonic() < deadline:
        alive = []
        for (pid, created), line in watch.seen.items():
            try:
                if psutil.Process(pid).create_time() == created:
                    alive.append(f"process {pid}: {line}")
            except psutil.Error:
                continue
        time.sleep(0.5)
    pids = {pid for pid, _ in watch.seen}
    cgroups = [
        str(d)
        for root in Path("/sys/fs/cgroup").glob("*")
        for d in [*root.glob("sandboxes-*"), *root.glob("*/*/sandboxes-*")]
        if d.name.split("-")[1:2] and d.name.split("-")[1].isdigit() and int(d.name.split("-")[1]) in pids
    ]
    files = [str(p) for p in tmp.iterdir() if not p.name.startswith(KEPT_BY_DESIGN)]
    ports = [
        f"port {c.laddr.port} held by pid {c.pid}"
        for c in psutil.net_connections("tcp")
        if c.status == "LISTEN" and c.laddr.port in watch.ports and c.pid in pids
    ]
    return alive + [f"cgroup {c}" for c in cgroups] + [f"temp {f}" for f in files] + ports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="the fault plan's and the run's seed (a failure replays)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=128, help="prompts a step (x --samples episodes)")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="times each fault is struck")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="--rollout.timeout_s, the episode deadline")
    parser.add_argument("--sft-steps", type=int, default=80, help="SFT steps of the tool-calling start")
    parser.add_argument("--smoke", action="store_true", help="each fault once, 4 steps of 64 episodes")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.prompts, args.samples, args.rounds, args.timeout_s = 4, 16, 4, 1, 20.0
    if args.rounds * len(FAULTS) > args.steps:
        parser.error(f"--rounds {args.rounds} x {len(FAULTS)} faults need at least as many --steps")
    rng = random.Random(args.seed)
    steps = rng.sample(range(1, args.steps + 1), args.rounds * len(FAULTS))
    plan = [Strike(f, s, rng.uniform(0.0, 0.5)) for f, s in zip(FAULTS * args.rounds, steps, strict=True)]
    work = Path(tempfile.mkdtemp(prefix="chaos-bench-"))
    tmp = Path(tempfile.mkdtemp(prefix="chaos-", dir="/tmp"))  # short: Ray's socket paths live under it
    failed = 1
    try:
        failed = run_chaos(args, plan, work, tmp)
        return failed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if failed:
            print(f"the run's files (its log, metrics.jsonl, the env servers' logs) are kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run_chaos(args: argparse.Namespace, plan: list[Strike], work: Path, tmp: Path) -> int:
    start = time.monotonic()
    model = sft_start(work, args.sft_steps)
    print(f"plan (seed {args.seed}): " + ", ".join(f"{s.fault}@{s.step}+{s.delay_s:.1f}s" for s in plan), flush=True)
    out = work / "rl"
    log = (work / "rl.log").open("w")
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(rl_command(model, out, args), stdout=log, stderr=subprocess.STDOUT, env=env)
    watch = Watch(psutil.Process(proc.pid), out / "metrics.jsonl", plan)
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    thread.start()
    rc = proc.wait(timeout=args.steps * (args.timeout_s + 120) + 300)
    stop.set()
    thread.join()
    problems = list(watch.errors)
    if rc != 0:
        problems.append(f"the run exited {rc}: {(work / 'rl.log').read_text()[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] if rc == 0 else []
    by_step = {int(r["step"]): r for r in records}
    lost = [s for s in range(1, args.steps + 1) if s not in by_step]
    longest = max((r["timing/rollout_s"] for r in records), default=0.0)
    print(
        f"steps finished: {len(by_step)}/{args.steps}; longest rollout {longest:.1f} s, deadline {args.timeout_s:.0f} s"
    )
    for s in plan:
        m = by_step.get(s.step, {})
        n = counted(s.fault, m)
        lost_here = int(s.step in lost)
        dropped = {k.removeprefix("rollout/"): int(v) for k, v in m.items() if "/dropped/" in k and v}
        struck = s.done or "not struck"
        print(f"  {s.fault} at step {s.step} ({struck}): {n:.0f} counted, {lost_here} steps lost; dropped {dropped}")
        if s.done and not n and s.step in by_step:
            seen = {k: v for k, v in m.items() if k.startswith(("sandbox/", "session/")) or "/dropped/" in k}
            problems.append(f"{s.fault} at step {s.step} ({s.done}) was not counted in its metrics: {seen}")
    if lost:
        problems.append(f"steps {lost} did not finish")
    if longest > args.timeout_s + MARGIN_S:
        problems.append(f"a rollout took {longest:.1f} s, past the deadline {args.timeout_s} s + {MARGIN_S} s")
    left = leftovers(watch, tmp)
    print(f"leftovers of the run: {len(left)} ({len(watch.seen)} processes seen, {len(watch.ports)} ports)")
    problems += [f"left over: {item}" for item in left]
    print(f"chaos run: {len(problems)} problem(s) in {time.monotonic() - start:.0f} s")
    for problem in problems:
        print("  PROBLEM", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
