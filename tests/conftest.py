"""Shared fixtures: a tiny tokenizer and model trained/built from scratch (no downloads), and an HF engine on it; a
session server with stock SDK clients (``serve``); and the rule that a skipped isolation test fails the run unless
``MOLT_SKIP_ISOLATION=1``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

GSM8K_TRAIN = Path(__file__).resolve().parents[1] / "molt_envs" / "envs" / "data" / "gsm8k" / "train.jsonl"


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from molt_train.models.tiny import train_tokenizer

    with GSM8K_TRAIN.open() as f:
        rows = [json.loads(line) for _, line in zip(range(1500), f, strict=False)]
    return train_tokenizer([r["question"] + "\n" + r["answer"] for r in rows], vocab_size=1024)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    from molt_train.models.tiny import build_tiny_model

    return build_tiny_model(tiny_tokenizer, seed=0)


@pytest.fixture
def tiny_engine(tiny_model, tiny_tokenizer):
    from molt_train.engines.hf import HFEngine

    return HFEngine(tiny_model, tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_vl_dir(tmp_path_factory):
    """A ``tiny-vl`` checkpoint (LLaVA classes, its processor) whose tokenizer was trained on shapes questions."""
    from molt_envs.envs.shapes import COLOURS, KINDS, generate_split
    from molt_train.models.tiny_vl import build_tiny_vl

    texts = [f"{r['question']} {r['answer']}" for r in generate_split("train", 200)] + list(COLOURS) + list(KINDS)
    return build_tiny_vl(texts, tmp_path_factory.mktemp("tiny-vl"), vocab_size=384, seed=0)


@pytest.fixture(scope="session")
def tiny_vl_engine(tiny_vl_dir):
    """An HF engine on the tiny VLM; ``.processor`` is what runners take, ``.tokenizer`` its text tokenizer."""
    from molt_train.engines.hf import HFEngine

    return HFEngine.from_pretrained(str(tiny_vl_dir))


@pytest.fixture
async def serve():
    """``await serve(engine, tokenizer, **kwargs)`` starts a SessionServer on loopback; ``serve.openai(server,
    session)`` / ``serve.anthropic(server, session)`` make stock SDK clients on a session. All close at teardown."""
    from anthropic import AsyncAnthropic
    from openai import AsyncOpenAI

    from molt_envs.sessions.server import SessionServer

    servers, clients = [], []

    async def start(engine, tokenizer, **kwargs) -> SessionServer:
        server = SessionServer(engine, tokenizer, **kwargs)
        await server.start()
        servers.append(server)
        return server

    def openai(server, session, **kwargs) -> AsyncOpenAI:
        clients.append(AsyncOpenAI(base_url=server.urls(session.session_id)[0], api_key="EMPTY", **kwargs))
        return clients[-1]

    def anthropic(server, session, **kwargs) -> AsyncAnthropic:
        clients.append(AsyncAnthropic(base_url=server.urls(session.session_id)[1], api_key="EMPTY", **kwargs))
        return clients[-1]

    start.openai, start.anthropic = openai, anthropic
    yield start
    for client in clients:
        await client.close()
    for server in servers:
        await server.stop()


# --- Isolation tests: a skipped sandbox test is not a pass ---------------------------------------------------------
# `make test` sets the machine up first (.ci/setup-machine.sh: bubblewrap, a Docker engine). A test counts as an
# isolation test when it lives under tests/sandboxes/ or a skip mark of it names the sandbox or isolation. If any of
# them skipped, the run fails, unless MOLT_SKIP_ISOLATION=1 says that is wanted; the summary line then counts them.
SKIP_ISOLATION = os.environ.get("MOLT_SKIP_ISOLATION") == "1"
_isolation_skips: list[tuple[pytest.TestReport, str]] = []  # (the skip report, its reason)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "isolation: needs sandbox isolation (bubblewrap jails, a Docker engine, root); must not skip"
    )


# `make test` runs two pytest-xdist workers (`-n 2 --dist load`): most of a test's time is spent waiting on
# processes it started (Ray workers importing torch, servers, pip, jails), so two streams overlap well on two cores.
# Tests are dealt out one by one, so the two workers end together; a file split across both sets its module fixtures
# up on each (`--dist loadgroup`, used before, grouped nothing: pytest 9 ignores the nodeid suffix xdist 3.8 writes;
# `--dist loadfile` measured slower, 27.5 against 26.2 min, its last files leaving one worker idle). The longest files
# are dealt first, so neither worker is left with one of them at the end.
LONGEST_FIRST = (
    "tests/molt_train/test_selfplay_learning.py",  # ~8 min
    "tests/test_benchmarks_smoke.py",  # ~7 min: every CPU bench's smoke, the chaos run among them
    "tests/molt_train/test_foreign_env_learning.py",
    "tests/molt_train/test_multinode.py",
    "tests/molt_train/test_trainer_ray.py",
    "tests/test_readme_commands.py",
)


def pytest_collection_modifyitems(config, items):
    def first(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=first)  # stable: every file keeps its own order
    for item in items:
        reasons = " ".join(str(m.kwargs.get("reason", "")) for m in item.iter_markers() if m.name in ("skip", "skipif"))
        if item.nodeid.startswith("tests/sandboxes/") or "sandbox" in reasons or "isolation" in reasons:
            item.add_marker("isolation")


def pytest_runtest_logreport(report):
    if report.skipped and "isolation" in report.keywords and "gpu" not in report.keywords:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _isolation_skips.append((report, reason.removeprefix("Skipped: ")))


def pytest_terminal_summary(terminalreporter):
    if not _isolation_skips:
        return
    reasons: dict[str, int] = {}
    for _, reason in _isolation_skips:
        reasons[reason] = reasons.get(reason, 0) + 1
    verdict = "allowed by MOLT_SKIP_ISOLATION=1" if SKIP_ISOLATION else "the run FAILS (a skip is not a pass)"
    terminalreporter.write_sep("!", f"{len(_isolation_skips)} isolation tests SKIPPED: {verdict}", red=True, bold=True)
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"  {count:4d} x {reason}", red=True)
    terminalreporter.write_line(
        "  set the machine up with `sudo .ci/setup-machine.sh` (bubblewrap, a Docker engine; run as root), "
        "or set MOLT_SKIP_ISOLATION=1 to accept the skips",
        red=True,
    )
    key = "isolation tests SKIPPED (MOLT_SKIP_ISOLATION=1)" if SKIP_ISOLATION else "isolation tests SKIPPED (failing)"
    terminalreporter.stats[key] = [report for report, _ in _isolation_skips]  # counted in the summary line


def pytest_sessionfinish(session):
    if _isolation_skips and not SKIP_ISOLATION and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
