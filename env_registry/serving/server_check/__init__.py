"""``molt-env check URL [--protocol molt-env/1|openenv]``: a protocol conformance suite for any env server, ours or not.

``server_report`` runs the checks of the URL's protocol in order, each under ``timeout_s`` (a server that never
answers fails that check instead of hanging the suite), and returns a ``molt_envs.conformance.CheckReport`` (its
``render()`` is the PASS/FAIL table). What each protocol's own client does is done with that client (``RemoteEnv``
for ``molt-env/1``, OpenEnv's ``GenericEnvClient``); only the garbage-in cases speak raw WebSocket frames (the
``websockets`` package). Rooms: ``common`` (the target, raw frames, the checks both wires share), ``molt`` and
``openenv`` (each protocol's wire and its own checks).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from env_registry.serving.server_check import molt, openenv
from env_registry.serving.server_check.common import Check, Outcome, Target, why
from molt_envs.conformance import CheckReport

PROTOCOLS = {"molt-env/1": molt, "openenv": openenv}


def parse_target(url: str, protocol: str, **options: Any) -> Target:
    """A ``Target`` from ``http[s]://host:port[/path]``.

    Raises:
        ValueError: not an http(s) URL, an unknown protocol, or a ``molt-env/1`` URL without an env ID path.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; one of {', '.join(PROTOCOLS)}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an env server URL; write http://host:port/ns/name-v1")
    path = parts.path.strip("/")
    if protocol == "molt-env/1":
        path = path.split("@")[0]  # a package pin is the env-level check's business
    if protocol == "molt-env/1" and not path:
        raise ValueError(f"{url!r} names no env; a molt-env/1 server is checked at http://host:port/ns/name-v1")
    return Target(url, protocol, PROTOCOLS[protocol].WIRE, f"{parts.scheme}://{parts.netloc}", path, **options)


def server_report(url: str, protocol: str = "molt-env/1", **options: Any) -> CheckReport:
    """Run every check of ``protocol`` against the server at ``url``; never raises for a broken server.

    Args:
        url: ``http://host:port/ns/name-v1`` (``molt-env/1``), or an OpenEnv app's URL (``http://host:port``).
        protocol: ``"molt-env/1"`` or ``"openenv"``.
        **options: ``sessions`` (concurrent episodes, default 16), ``max_sessions`` (the server's limit: the
            concurrency check stays within it, and an OpenEnv server is checked to answer ``CAPACITY_REACHED`` past
            it), ``timeout_s`` (each check, default 30).

    Raises:
        ValueError: the URL or the protocol is not one this suite checks.
    """
    target = parse_target(url, protocol, **options)
    report = CheckReport(f"{protocol} server at {url}")
    for name, check in PROTOCOLS[protocol].CHECKS:
        if check is openenv.capacity and not target.max_sessions:
            continue  # OpenEnv servers do not publish their limit: checked only with --max-sessions N (the CLI says so)
        passed, detail = asyncio.run(_run_one(check, target))
        report.add(name, passed, detail)
    return report


async def _run_one(check: Check, target: Target) -> Outcome:
    try:
        async with asyncio.timeout(target.timeout_s):
            return await check(target)
    except TimeoutError:
        return False, f"no outcome within {target.timeout_s:g} s (the server did not answer)"
    except Exception as exc:
        return False, why(exc)
