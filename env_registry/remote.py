"""Envs behind an env server (a URL, an isolated install): their spec, their instances and their dataset rows.

A ``RemoteEnvSpec`` is the server's ``EnvSpec``, whose ``hash`` is the one the server computed, with a way to reach the
server (``env_registry.serving.urls`` makes them from URLs, ``env_registry.installs.isolated`` from isolated
installs). ``factory`` makes the client instances (``molt_envs.remote.client``; a game's is ``RemoteGame``) for the
runners; ``rows`` streams a split from the server, so a trainer draws prompts without the env package installed.
Every failure to use a server is an ``EnvServerUnavailable`` naming the server and what to do.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import PrivateAttr

from env_registry.errors import EnvServerUnavailable
from env_registry.manifest import EnvSpec
from molt_envs.seats import Game

HTTP_TIMEOUT_S = 30.0


class RemoteEnvSpec(EnvSpec):
    """An ``EnvSpec`` served by an env server. It dumps and hashes as the plain spec it is (``to_json`` round-trips
    as an ``EnvSpec``); ``hash`` is the server's, ``where`` says which server, ``endpoint()`` reaches it."""

    _hash: str = PrivateAttr()
    _where: str = PrivateAttr()
    _endpoint: Callable[[], Any] = PrivateAttr()

    @classmethod
    def served(cls, spec: dict[str, Any], spec_hash: str, where: str, endpoint: Callable[[], Any]) -> RemoteEnvSpec:
        known = {k: v for k, v in spec.items() if k in cls.model_fields}  # a newer server may know more fields
        made = cls.model_validate(known)
        made._hash, made._where, made._endpoint = spec_hash, where, endpoint
        return made

    @property
    def hash(self) -> str:
        return self._hash

    @property
    def where(self) -> str:
        return self._where

    def endpoint(self) -> Any:
        """The ``molt_envs.remote.client.Endpoint`` of its server (an isolated install's server starts here)."""
        return self._endpoint()


class ServerPolicy:
    """A scripted policy (``"random"``, ``"pkg.mod:fn"``) of a ``RemoteGame``: a name the server plays, not code."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"ServerPolicy({self.name!r})"

    def __call__(self, *args: Any) -> Any:
        raise TypeError(f"{self!r} is played by the game's env server (RemoteGame.play_policy), not called here")


class RemoteGame(Game):
    """A ``molt_envs.seats.Game`` living in an env server: one WebSocket (``GameSession``) per game, opened at make
    (the server makes the instance and says its seats and who plays them). Scripted seats are played there
    (``scripted`` returns a ``ServerPolicy`` naming them; ``play_policy`` sends the name and the runner's random
    state, and takes back the state the policy left); the model's and frozen checkpoints' moves are generated here
    and sent as ``play_text``. ``to_move`` is the one the last reset or move answered (no round trip)."""

    def __init__(self, endpoint: Any) -> None:
        from molt_envs.remote.client import GameSession

        self._session = GameSession(endpoint)
        self._to_move: str | None = None
        try:
            setup = self._session.call("game").setup
            super().__init__(setup.seats, mode=setup.mode, opponent=setup.opponent, seat_policies=setup.seat_policies)
        except BaseException:
            with contextlib.suppress(Exception):
                self.close()
            raise

    def _moved(self, kind: str, data: dict[str, Any]) -> Any:
        answer = self._session.call(kind, data)
        self._to_move = answer.to_move
        return answer

    def reset(self, seed: int | None) -> None:
        self._moved("game_reset", {"seed": seed})

    def to_move(self) -> str | None:
        return self._to_move

    def observe(self, seat: str, first: bool) -> list[dict[str, Any]]:
        return self._session.call("observe", {"seat": seat, "first": first}).messages

    def play_text(self, seat: str, text: str) -> bool:
        return bool(self._moved("play_text", {"seat": seat, "text": text}).going)

    def play_policy(self, seat: str, policy: Callable[..., Any], rng: random.Random) -> bool:
        if not isinstance(policy, ServerPolicy):
            raise TypeError(
                f"{policy!r} is code of this process; a RemoteGame plays only its scripted() policies, in its server"
            )
        version, internal, gauss = rng.getstate()
        data = {"seat": seat, "policy": policy.name, "rng_state": [version, list(internal), gauss]}
        answer = self._moved("play_policy", data)
        version, internal, gauss = answer.rng_state
        rng.setstate((version, tuple(internal), gauss))
        return bool(answer.going)

    def returns(self) -> dict[str, float]:
        return self._session.call("returns").returns

    def info(self, seat: str) -> dict[str, float]:
        return self._session.call("info", {"seat": seat}).info

    def scripted(self, policy: str) -> Callable[..., Any]:
        return ServerPolicy(policy)

    def close(self) -> None:
        self._session.close()


def factory(spec: RemoteEnvSpec) -> Callable[[], Any]:
    """A function making a fresh client instance per episode (``RemoteEnv``, ``RemoteChatAgent``, or a game's
    ``RemoteGame``)."""
    from molt_envs.remote.client import RemoteChatAgent, RemoteEnv

    endpoint = spec.endpoint()
    cls = {"chat_agent": RemoteChatAgent, "game": RemoteGame}.get(spec.kind, RemoteEnv)

    def new_instance() -> Any:
        instance = cls(endpoint)
        instance.spec = spec
        return instance

    return new_instance


def rows(spec: RemoteEnvSpec, split: str, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """The rows of ``split`` as the server's registry normalizes them, streamed.

    Raises:
        EnvServerUnavailable: the split does not exist there, or the server failed or cut the stream.
    """
    import httpx

    endpoint = spec.endpoint()
    url = f"{endpoint.base_url}/{spec.id}/datasets/{split}"
    params = {} if limit is None else {"limit": limit}
    try:
        with httpx.stream("GET", url, params=params, timeout=httpx.Timeout(HTTP_TIMEOUT_S, read=None)) as response:
            if response.status_code != 200:
                response.read()
                raise EnvServerUnavailable(f"{url} answered HTTP {response.status_code}: {_detail(response)}")
            for line in response.iter_lines():
                if not line:
                    continue
                item = json.loads(line)
                if not isinstance(item, dict):
                    raise ValueError(f"{line[:80]!r} is not a JSON object")
                if "row" in item:
                    yield item["row"]
                elif "end" in item:
                    return
                else:
                    raise EnvServerUnavailable(f"{spec.where} failed reading split {split!r}: {item.get('error')}")
    except httpx.HTTPError as exc:
        raise EnvServerUnavailable(f"reading split {split!r} from {url}: {type(exc).__name__}: {exc}") from None
    except (ValueError, TypeError) as exc:
        raise EnvServerUnavailable(f"{url} sent a line that is not JSON: {exc}") from None
    raise EnvServerUnavailable(f"{url} ended the split {split!r} before its last row (the server stopped?)")


def _detail(response: Any) -> str:
    try:
        return str(response.json().get("detail", response.text))
    except ValueError:
        return response.text[:200]
