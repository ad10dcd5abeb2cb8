"""Every CPU benchmark in benchmarks/ runs its ``--smoke`` mode here (``make test``), so none can rot unnoticed: the
same code path at tiny sizes, as a subprocess with this venv's python, exit code 0, and the comparison line(s) it
prints against its baseline, with numbers in them. The figures themselves are meaningless at these sizes and are
not checked; a smoke writes nothing into the repository (``demo_seeds.py``'s table in the READMEs included).

The GPU benchmarks (benchmarks/gpu/) need a GPU; here they only have to compile."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sandboxes

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
NUM = r"-?[\d,]+(?:\.\d+)?"  # a printed figure
SIGNED = r"[+-]\d+\.\d"  # a difference in points

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl (pip install -e '.[dev]')")
_local_missing = sandboxes.probe(docker=False).local_missing
needs_local_sandbox = pytest.mark.skipif(
    bool(_local_missing), reason="needs the local sandbox (bubblewrap isolation): " + "; ".join(_local_missing)
)

# bench -> the lines its smoke must print (regular expressions, searched in stdout + stderr)
EXPECTED = {
    "remote_env_bench.py": [
        rf"gen {gen} ms, {n} episodes: added p50 {NUM} ms \({where} {NUM}, in process {NUM}\); ratio steps/s {where} / "
        rf"in process {NUM}x"
        for gen in (5, 0)
        for n in (1, 4)
        for where in ("remote", "openenv")
    ],
    "ecosystems_bench.py": [
        rf"{eco} {n} episodes: adapter p50 {NUM} us, mean {NUM} us; native p50 {NUM} us, mean {NUM} us; ratio p50 "
        rf"{NUM}x, mean {NUM}x, wall/step {NUM}x" + (rf" \(in process: p50 {NUM}x, mean {NUM}x\)" if hop else "")
        for eco, hop in (("rg", True), ("textarena", True), ("gym", True), ("openenv", False))
        for n in (1, 4)
    ],
    "session_server_bench.py": [
        rf"\| {wire} \| {n} \| {n * 2} \| {NUM} \| {NUM} / {NUM} \| {NUM} / {NUM} \| {NUM} \|"
        for wire in ("openai", "anthropic", "responses")
        for n in (1, 4)
    ]
    + [rf"handler p50 ratio to openai at {n} sessions: anthropic {NUM}x, responses {NUM}x" for n in (1, 4)],
    "scale_bench.py": [
        *(
            rf"episodes: gen {gen} ms, 8 episodes over 2 servers: added p50 {NUM} ms, p99 {NUM} ms \(in process {NUM}\); "
            rf"steps/s {NUM} \(in process {NUM}, ratio {NUM}x\); CPU ms/step client {NUM} \(in process {NUM}\), servers {NUM}"
            for gen in (5, 0)
        ),
        rf"sandboxes: 8 persistent sessions open \({NUM} s to open, {NUM} MB each\): 40 calls, 4 in flight: {NUM} calls/s, "
        rf"p50 {NUM} ms, p99 {NUM} ms, 0 failed; on 4 sessions: {NUM} calls/s, p50 {NUM} ms, 0 failed; ratio calls/s {NUM}x",
    ],
    "sandbox_bench.py": [
        rf"a: fresh python -I -c\s+{NUM}\s+{NUM}\s+{NUM}",
        rf"b: sandboxes local\s+{NUM}\s+{NUM}\s+{NUM}",
        rf"(c: sandboxes docker\s+{NUM}\s+{NUM}\s+{NUM}|# c: docker skipped)",
        rf"ratio a/b: p50 {NUM}x, throughput {NUM}x",
    ],
    "registry_bench.py": [
        rf"\| {backend} \| publish \(4 clients\) \| 4 \| {NUM} releases/s \|" for backend in ("sqlite", "postgresql")
    ]
    + [
        rf"ratio req/s vs /api/health, {backend}, {n} clients: /simple/<pkg>/ {NUM}x, /api/resolve {NUM}x, "
        rf"/packages/<pkg> {NUM}x, /envs/<id> {NUM}x"
        for backend in ("sqlite", "postgresql")
        for n in (1, 4)
    ]
    + [
        rf"viewer 1000 episodes \({NUM} MB\): index {NUM} ms, field scan json {NUM} ms, orjson ({NUM}|nan) ms",
        rf"viewer first page cold p50 {NUM} ms, max {NUM} ms; warm p50 {NUM} ms, p99 {NUM} ms; baseline whole file "
        rf"{NUM} ms; ratio cold/baseline {NUM}x",
        rf"viewer filtered page cold p50 {NUM} ms; warm p50 {NUM} ms, p99 {NUM} ms; last page warm p50 {NUM} ms",
        r"goal first page <= 300 ms \(cold, max\): (met|NOT met)",
    ],
    "eval_bench.py": [rf"concurrency {n}: both sides sent the same \d+ requests" for n in (1, 4)]
    + [rf"concurrency {n}: plain {NUM}/s, eval {NUM}/s, ratio {NUM}; best eval" for n in (1, 4)]
    + [rf"\| {n} \| 8 \| {NUM} \| {NUM} \| {NUM} \|" for n in (1, 4)],
    "trl_baseline.py": [
        rf"start checkpoint .*: held-out greedy accuracy {NUM}% on 16 test rows",
        rf"TRL: [1-9]\d* steps in {NUM}s .* {NUM} samples/s, accuracy {NUM}%",
        rf"accuracy TRL - start: {SIGNED} points",
    ],
    "trainer_vs_trl.py": [
        rf"seed 42 molt: 2 steps in {NUM}s .* {NUM} samples/s, accuracy {NUM}%",
        rf"seed 42 TRL : [1-9]\d* steps in {NUM}s .* {NUM} samples/s, accuracy {NUM}%",
        rf"ratio of mean samples/s molt/TRL: {NUM}x \(per seed: {NUM}\); mean accuracy molt - TRL: {SIGNED} points",
        r"target \(>= 2x samples/s at equal or better mean accuracy\): (met|NOT met)",
    ],
    "demo_seeds.py": [
        rf"\| 42 \| {NUM}% \| {NUM}% \(2\) \| {NUM}% \| {SIGNED} \| {SIGNED} \| \d+ / \d+ \| (yes|\*\*no\*\*) \|",
        rf"Gain over the SFT baseline on 1 seeds: min {SIGNED}, median {SIGNED}, max {SIGNED} points",
    ],
    "chaos_bench.py": [  # the run's checks: every fault struck and counted, no step lost, nothing left over
        rf"steps finished: 4/4; longest rollout {NUM} s, deadline 20 s",
        *(
            rf"{fault} at step \d \((pid \d+|\d+ connection\(s\) to port \d+)\): [1-9]\d* counted, 0 steps lost;"
            for fault in ("env_server_kill", "sandbox_worker_kill", "env_server_stop", "session_cut")
        ),
        r"leftovers of the run: 0 \(",
        rf"chaos run: 0 problem\(s\) in {NUM} s",
    ],
    "staleness_ab.py": [rf"seed 42 {variant}\s+RL {NUM}%" for variant in ("on-policy", "stale\\+tis")]
    + [
        rf"\| on-policy \| {NUM}% \| {NUM}% \|",
        rf"stale\+tis vs on-policy: mean pass@1 {SIGNED} points, ratio of RL training s {NUM}x",
    ],
}
MARKS = {
    "sandbox_bench.py": [needs_local_sandbox],
    "scale_bench.py": [needs_local_sandbox],
    "chaos_bench.py": [needs_local_sandbox, pytest.mark.slow],
    "trl_baseline.py": [needs_trl, pytest.mark.slow],
    "trainer_vs_trl.py": [needs_trl, pytest.mark.slow],
    "demo_seeds.py": [pytest.mark.slow],
    "staleness_ab.py": [pytest.mark.slow],
}
# the tables the full demo_seeds.py writes into these docs; a smoke must leave them as they are
SEED_TABLES = [BENCHMARKS / "README.md", ROOT / "docs" / "demo.md"]


def seed_tables() -> list[list[str]]:
    return [
        re.findall(r"<!-- demo-seeds:begin -->.*?<!-- demo-seeds:end -->", p.read_text(), re.S) for p in SEED_TABLES
    ]


def test_every_cpu_bench_has_a_smoke_test_and_the_gpu_ones_compile():
    assert sorted(p.name for p in BENCHMARKS.glob("*.py")) == sorted(EXPECTED)
    for path in sorted((BENCHMARKS / "gpu").glob("*.py")):
        compile(path.read_text(), str(path), "exec")  # a SyntaxError fails the test


@pytest.mark.parametrize(
    "bench", [pytest.param(name, marks=MARKS.get(name, []), id=name.removesuffix(".py")) for name in EXPECTED]
)
def test_smoke(bench, tmp_path):
    before = seed_tables()
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / bench), "--smoke"],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # a smoke writes nothing where it runs either
        timeout=540,
    )
    output = done.stdout + done.stderr
    print(f"{bench} --smoke: {time.perf_counter() - start:.1f} s")
    assert done.returncode == 0, f"{bench} --smoke exited {done.returncode}:\n{output[-6000:]}"
    missing = [pattern for pattern in EXPECTED[bench] if not re.search(pattern, output)]
    assert not missing, f"{bench} --smoke did not print {missing}:\n{done.stdout[-6000:]}"
    assert seed_tables() == before, f"{bench} --smoke wrote its table into {SEED_TABLES}"
    assert not list(tmp_path.iterdir()), f"{bench} --smoke wrote {sorted(tmp_path.iterdir())} into its working dir"
