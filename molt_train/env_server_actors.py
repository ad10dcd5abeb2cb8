"""The env servers of a Ray run: each isolated install's ``serve-env`` process owned by an ``EnvServerActor``.

Outside Ray, ``make(ID)`` of an isolated install starts the env server as a child process of the caller
(``env_registry.serving.managed_servers``). Under Ray the trainer starts it in a Ray actor on the caller's node instead, so
Ray's state API lists every env server of a run with its node, and a server dies with its node and its owner:
``serve_here`` (called by the driver, which reads the envs' datasets from it, and by every ``RolloutWorker``, which
runs its episodes on it) starts one ``EnvServerActor`` per isolated env on the calling process's node, and points
this process's registry at it (``make(ID)`` and ``runner_for(ID)`` reach it). The caller owns the actor: a rollout
worker lost with its node takes its env servers with it, and its replacement starts its own where it is placed.
After a wire failure the client's endpoint asks the actor to probe the server and restart it if it died or hung.

``isolated_installs`` (on the driver) says which of a run's envs are isolated installs; what it returns travels to
the rollout workers with their other arguments, so a worker needs no registry cache of its own, only the install's
venv at the same path on its node (``molt_train.node_paths`` checks that at start-up).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from env_registry.errors import EnvServerUnavailable
from env_registry.installs.isolated import IsolatedInstall, install_of
from env_registry.remote import RemoteEnvSpec
from env_registry.serving.managed_servers import PROBE_TIMEOUT_S, ManagedEndpoint, ManagedServer


class EnvServerActor:
    """A Ray actor owning one env server: ``serve-env ENV_ID`` in an isolated install's venv on this actor's node.

    Raises:
        EnvServerUnavailable: the venv is not on this node, or the server did not start (``ManagedServer.start``).
    """

    def __init__(self, install: IsolatedInstall, env_id: str) -> None:
        import ray

        self.node = ray.util.get_node_ip_address()
        if not Path(install.python).is_file():
            raise EnvServerUnavailable(
                f"{install.where} is not on node {self.node} ({install.python} does not exist there); install it on "
                f"every node (`molt-env install {env_id} --isolated`) or put $MOLT_CACHE on a directory every node "
                "mounts at the same path"
            )
        where = f"{install.where} on node {self.node}"
        self.server = ManagedServer(install.python, env_id, where, install.hashes[env_id])
        self.server.start()

    def address(self) -> tuple[str, str]:
        """``(base_url, node IP)`` of the server (loopback: its clients run on this node)."""
        return self.server.base_url, self.node

    def healthy(self, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
        return self.server.healthy(timeout_s)

    def restart(self) -> str:
        """Restart the server (it died or hung); returns its new base URL."""
        return self.server.restart()

    def stop(self) -> None:
        """Stop the server and remove its log (an actor killed instead leaves its log; the server exits by itself
        when its stdin closes)."""
        self.server.stop()
        self.server.log_path.unlink(missing_ok=True)


class _ActorServer:
    """What ``ManagedEndpoint`` probes and restarts, done by the ``EnvServerActor`` on the server's node."""

    def __init__(self, actor: Any, env_id: str, where: str, base_url: str) -> None:
        self.actor, self.env_id, self.where, self.base_url = actor, env_id, where, base_url
        self.restarts = 0

    def healthy(self, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
        import ray

        try:
            return ray.get(self.actor.healthy.remote(timeout_s), timeout=timeout_s + 30)
        except (ray.exceptions.RayError, TimeoutError):
            return False

    def restart(self) -> str:
        import ray

        self.restarts += 1
        try:
            self.base_url = ray.get(self.actor.restart.remote())
        except ray.exceptions.RayActorError as exc:  # the actor itself is gone (its node, its owner)
            raise EnvServerUnavailable(f"the EnvServerActor of {self.where} is gone: {exc}") from None
        return self.base_url


def isolated_installs(env_ids: Iterable[str]) -> dict[str, IsolatedInstall]:
    """The isolated installs among ``env_ids`` (as the run's ``--env`` flags give them), keyed by the env ID their
    specs name (the ID as given, resolved: unpinned, versioned)."""
    import env_registry

    found = {}
    for env_id in env_ids:
        spec = env_registry.spec(env_id)
        install = install_of(spec.id) if isinstance(spec, RemoteEnvSpec) else None
        if install is not None:
            found[spec.id] = install
    return found


def serve_here(installs: dict[str, IsolatedInstall]) -> list[Any]:
    """Start an ``EnvServerActor`` on this process's node for each of ``installs`` (``isolated_installs``; in
    parallel) and make this process's registry reach them (in place of a child server); returns the actors (owned by this process: they die with it).

    Raises:
        EnvServerUnavailable: a server did not start (the message names the install, the node and why).
    """
    import ray

    import env_registry
    from molt_train.placement import on_this_node

    actor_cls = ray.remote(num_cpus=0)(EnvServerActor)
    started = {}
    for env_id, install in installs.items():
        started[env_id] = (install, actor_cls.options(**on_this_node()).remote(install, env_id))
    for env_id, (install, actor) in started.items():
        try:
            base_url, node = ray.get(actor.address.remote())
        except ray.exceptions.RayActorError as exc:  # its __init__ raised: the cause is in the message
            raise EnvServerUnavailable(f"the env server of {install.where} did not start: {exc}") from None
        where = f"{install.where}, served by an EnvServerActor on node {node}"
        endpoint = ManagedEndpoint(_ActorServer(actor, env_id, where, base_url))
        spec = RemoteEnvSpec.served(install.specs[env_id], install.hashes[env_id], where, lambda e=endpoint: e)
        env_registry.registry.add_served(spec)
    return [actor for _, actor in started.values()]
