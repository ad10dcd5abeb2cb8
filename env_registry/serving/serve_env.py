"""``molt-env serve-env ID``: serve a registered ID in this process over the env protocol.

The env, its grader, its datasets and its sandboxed tools all run in the server's process (``molt_envs.remote.server``).
"""

from __future__ import annotations

from itertools import islice

from env_registry.datasets import iter_split
from env_registry.registry import registry
from env_registry.sources import for_scheme


def serve_env(
    env_id: str,
    host: str = "127.0.0.1",
    port: int = 0,
    max_episodes: int | None = None,
    exit_on_stdin_eof: bool = False,
) -> None:
    """Serve ``env_id``, registered in this interpreter, until interrupted; prints one line with its URL once it
    accepts episodes (``port=0`` picks a free port).

    Raises:
        Error: the ID does not resolve here, or its entry point cannot be loaded (checked before listening).
        OSError: the address cannot be bound.
    """
    from molt_envs.remote.protocol import PROTOCOL
    from molt_envs.remote.server import ServedEnv, create_app, serve

    source = for_scheme(env_id)  # another ecosystem's ID: served from here, in this process
    # imports the env now: a broken package fails here, not per episode
    spec, make = registry.factory(source.local_spec(env_id) if source is not None else env_id)
    served = ServedEnv(
        env_id=spec.id,
        kind=spec.kind,
        factory=make,
        spec=spec.model_dump(mode="json"),
        spec_hash=spec.hash,
        rows=lambda split, limit: islice(iter_split(spec, split), limit),
        splits=list(spec.datasets),
    )
    app = create_app([served], max_episodes=max_episodes)
    limit = f", at most {max_episodes} episodes at once" if max_episodes else ""

    def ready(base_url: str) -> None:
        print(f"molt-env serve-env: serving {spec.id} at {base_url}/{spec.id} ({PROTOCOL}{limit})", flush=True)

    serve(app, host, port, on_ready=ready, exit_on_stdin_eof=exit_on_stdin_eof)
