"""The trainer's env servers on a local Ray instance: ``serve_here`` starts an ``EnvServerActor`` that runs
``serve-env`` under a given interpreter (here this one, serving the built-in ``molt/arith-v1`` as an isolated
install would be served), and points this process's registry at it; a venv missing on the node is a clear error."""

from __future__ import annotations

import asyncio
import sys

import pytest

import env_registry
from env_registry.errors import EnvServerUnavailable
from env_registry.installs.isolated import IsolatedInstall
from env_registry.remote import RemoteEnvSpec
from molt_envs import SamplingParams
from molt_envs.replay_model import ByteChatTokenizer, ReplayEngine
from molt_train.env_server_actors import serve_here

ARITH = "molt/arith-v1"


def install(python: str) -> IsolatedInstall:
    spec = env_registry.spec(ARITH)
    return IsolatedInstall(
        package=spec.package or "molt-ecosystem",
        version=spec.package_version or "0",
        env_ids=[ARITH],
        venv=python,
        python=python,
        status="installed",
        specs={ARITH: spec.model_dump(mode="json")},
        hashes={ARITH: spec.hash},
    )


def test_serve_here_serves_the_env_from_an_actor_on_this_node(ray_local, monkeypatch):
    import ray

    served = install(sys.executable)
    # as if the package were not installed here (a package installed here keeps its ID); restored after the test
    monkeypatch.setattr(env_registry.registry, "_specs", dict(env_registry.registry._specs))
    del env_registry.registry._specs[ARITH]
    actors = serve_here({ARITH: served})
    try:
        spec = env_registry.spec(ARITH)
        assert isinstance(spec, RemoteEnvSpec) and "served by an EnvServerActor on node" in spec.where
        assert spec.hash == served.hashes[ARITH]  # the server computed the same hash
        base_url, node = ray.get(actors[0].address.remote())
        assert spec.endpoint().base_url == base_url and node == ray.util.get_node_ip_address()
        tokenizer = ByteChatTokenizer()
        runner = env_registry.runner_for(ARITH)
        traj = asyncio.run(
            runner.execute("1+2=", "3", SamplingParams(max_tokens=8), 256, tokenizer, ReplayEngine(tokenizer, "3"))
        )
        assert (traj.failure, traj.reward) == (None, 1.0)
        new_url = ray.get(actors[0].restart.remote())  # what the client's endpoint asks after a wire failure
        assert ray.get(actors[0].healthy.remote()) and new_url != base_url
    finally:
        ray.get([actor.stop.remote() for actor in actors])  # the server and its log
        for actor in actors:
            ray.kill(actor)


def test_a_venv_missing_on_the_node_is_a_clear_error(ray_local, tmp_path):
    with pytest.raises(EnvServerUnavailable, match=r"is not on node .*gone/bin/python does not exist there"):
        serve_here({ARITH: install(str(tmp_path / "gone" / "bin" / "python"))})
