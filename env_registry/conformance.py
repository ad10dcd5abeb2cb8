"""Conformance of an env given by ID or spec: its spec, its datasets and the contract checks of
``molt_envs.conformance``. An env behind an env server (a URL, an isolated install) is checked through the server, as
a trainer would use it. ``check_env`` is what an env package's own test calls:
``check_env("ns/name-v1").assert_passed()``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from env_registry.datasets import load_split
from env_registry.errors import Error
from env_registry.manifest import EnvSpec
from env_registry.registry import registry
from env_registry.remote import RemoteEnvSpec
from molt_envs import conformance
from molt_envs.conformance import CheckReport
from molt_envs.seats import OneSeatEnv

SAMPLE_ROWS = 3


def check(target: str | EnvSpec) -> CheckReport:
    """Check one registered env ID, or a spec as given (e.g. read from a source tree); never raises for a broken
    env, the report says what broke."""
    try:
        spec = target if isinstance(target, EnvSpec) else registry.spec(target)
    except Error as exc:
        report = CheckReport(str(target))
        report.add("resolve id", False, str(exc))
        return report
    origin = f"{spec.package} {spec.package_version}" if spec.package else "registered at run time"
    if isinstance(spec, RemoteEnvSpec):  # a URL or an isolated install: checked through its server
        origin += f", served by {spec.where}"
    report = CheckReport(f"{spec.id} ({origin})")
    try:
        _, make = registry.factory(spec)
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

    sub = conformance.check_env(
        factory,
        rows[:SAMPLE_ROWS],
        subject=report.subject,
        kind="env" if spec.kind == "game" else spec.kind,
        reward_range=spec.reward_range,
        deterministic=spec.deterministic,
    )
    report.checks.extend(sub.checks)
    return report


def check_env(
    target: str | EnvSpec | Callable[[], Any], rows: Sequence[dict[str, Any]] | None = None, **options: Any
) -> CheckReport:
    """Run the conformance checks on an env, however one has it.

    Args:
        target: a registered env ID (or URL), an ``EnvSpec``, or a factory making fresh env instances.
        rows: the dataset rows to check a factory against (an ID or a spec brings its own datasets).
        **options: for a factory, ``molt_envs.conformance.check_env``'s options (``kind``, ``reward_range``,
            ``deterministic``, ``subject``).

    Returns:
        The report; ``report.assert_passed()`` raises ``AssertionError`` with it unless every check passed.

    Raises:
        TypeError: for rows or options given with an ID or a spec (the spec declares them), or a factory without rows.
    """
    if isinstance(target, str | EnvSpec):
        if rows is not None or options:
            raise TypeError(f"an env ID or spec brings its own rows and declarations; drop rows/{sorted(options)}")
        return check(target)
    if rows is None:
        raise TypeError(f"checking the factory {target!r} needs dataset rows: check_env(factory, rows)")
    return conformance.check_env(target, rows, **options)
