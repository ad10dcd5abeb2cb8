"""Conformance of a registered env: its spec, its datasets and the contract checks of ``molt_envs.conformance``.
An env behind an env server (a URL, an isolated install) is checked through the server, as a trainer would use it."""

from __future__ import annotations

from env_registry.datasets import load_split
from env_registry.errors import Error
from env_registry.registry import registry
from env_registry.remote import RemoteEnvSpec
from molt_envs.conformance import CheckReport, check_env
from molt_envs.seats import OneSeatEnv

SAMPLE_ROWS = 3


def check(env_id: str) -> CheckReport:
    """Check one registered env ID; never raises for a broken env, the report says what broke."""
    try:
        spec = registry.spec(env_id)
    except Error as exc:
        report = CheckReport(env_id)
        report.add("resolve id", False, str(exc))
        return report
    origin = f"{spec.package} {spec.package_version}" if spec.package else "registered at run time"
    if isinstance(spec, RemoteEnvSpec):  # a URL or an isolated install: checked through its server
        origin += f", served by {spec.where}"
    report = CheckReport(f"{spec.id} ({origin})")
    try:
        _, make = registry.factory(env_id)
    except Error as exc:
        report.add("load entry point", False, str(exc))
        return report
    rows: list[dict] = []
    for split in spec.datasets:
        try:
            rows += load_split(spec, split, SAMPLE_ROWS)
        except Exception as exc:
            report.add(f"dataset split {split!r}", False, f"{type(exc).__name__}: {exc}")

    def factory():
        instance = make()
        return OneSeatEnv(instance) if spec.kind == "game" else instance  # a game is checked from one seat

    sub = check_env(
        factory,
        rows[:SAMPLE_ROWS],
        subject=report.subject,
        kind="env" if spec.kind == "game" else spec.kind,
        reward_range=spec.reward_range,
        deterministic=spec.deterministic,
    )
    report.checks.extend(sub.checks)
    return report
