"""Envs behind an env server: ``make("http://host:port/ns/name-v1")``, and the isolated installs' servers.

``url_spec`` checks that the URL is an env server speaking this client's protocol and serving that ID, and returns a
``RemoteEnvSpec``: the server's ``EnvSpec``, whose ``hash`` is the one the server computed, with a way to reach the
server. ``factory`` makes the client instances (``molt_envs.remote_env``) for the runners; ``rows`` streams a split
from the server, so a trainer draws prompts without the env package installed. Every failure to use a server is
an ``EnvServerUnavailable`` naming the URL (or the install) and what to do.

URL options (query string): ``timeout_s`` bounds each reset/step answer (default ``$MOLT_ENV_TIMEOUT_S`` or 300).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import PrivateAttr, ValidationError

from env_registry.errors import EnvServerUnavailable, InvalidEnvId
from env_registry.ids import parse_env_id
from env_registry.manifest import EnvSpec

HTTP_TIMEOUT_S = 30.0
_CONNECTED: dict[str, RemoteEnvSpec] = {}
_LOCK = threading.Lock()


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
        """The ``molt_envs.remote_env.Endpoint`` of its server (an isolated install's server starts here)."""
        return self._endpoint()


def is_url(env_id: str) -> bool:
    return isinstance(env_id, str) and env_id.startswith(("http://", "https://"))


def url_spec(url: str) -> RemoteEnvSpec:
    """The spec of the env served at ``url`` (``http[s]://host:port/[ns/]name-vN[@pin][?timeout_s=S]``), checked once
    per process and URL.

    Raises:
        InvalidEnvId: the URL is malformed or its path is not an env ID.
        EnvServerUnavailable: nothing answers there, it is no env server, it speaks another protocol version, it does
            not serve that ID, its answers are garbage, or its package version differs from the ``@pin``.
    """
    with _LOCK:
        if url not in _CONNECTED:
            _CONNECTED[url] = _connect(url)
        return _CONNECTED[url]


def _connect(url: str) -> RemoteEnvSpec:
    from molt_envs.remote_env import TIMEOUT_S, Endpoint

    parts = urlsplit(url)
    path = parts.path.strip("/")
    if not parts.hostname or not path:
        raise InvalidEnvId(f"{url!r} is not an env server URL; write http://host:port/ns/name-vN")
    try:
        env_id = parse_env_id(path)
    except InvalidEnvId:
        raise InvalidEnvId(f"the path of {url!r} is not an env ID; write http://host:port/ns/name-vN") from None
    options = parse_qs(parts.query)
    unknown = sorted(set(options) - {"timeout_s"})
    if unknown:
        raise InvalidEnvId(f"{url!r}: unknown option(s) {unknown}; the only option is ?timeout_s=SECONDS")
    try:
        timeout_s = float(options.get("timeout_s", [TIMEOUT_S])[-1])
    except ValueError:
        raise InvalidEnvId(f"{url!r}: timeout_s must be a number of seconds") from None
    base = f"{parts.scheme}://{parts.netloc}"
    metadata = check_server(base, env_id.unpinned)
    spec_data = metadata.spec
    if env_id.pin is not None and spec_data.get("package_version") != env_id.pin:
        raise EnvServerUnavailable(
            f"{url} pins package version {env_id.pin}, but the server runs {spec_data.get('package')} "
            f"{spec_data.get('package_version')}; drop the pin or serve that version"
        )
    endpoint = Endpoint(base, env_id.unpinned, timeout_s=timeout_s)
    return _spec_of(metadata, f"the env server at {base}", lambda: endpoint, url)


def check_server(base: str, env_id: str) -> Any:
    """``/health`` and ``/<env id>/metadata`` of the server at ``base``, validated; returns the ``Metadata``."""
    from molt_envs.env_protocol import PROTOCOL, Health, Metadata

    health = Health.model_validate(_get_json(base, "/health", "health", Health))
    if health.protocol != PROTOCOL:
        raise EnvServerUnavailable(
            f"the env server at {base} speaks {health.protocol!r}, this client speaks {PROTOCOL!r}; "
            "install the same molt-ecosystem release on both sides"
        )
    if env_id not in health.envs:
        raise EnvServerUnavailable(f"the env server at {base} serves {health.envs}, not {env_id!r}")
    metadata = Metadata.model_validate(_get_json(base, f"/{env_id}/metadata", "metadata", Metadata))
    if metadata.id != env_id or metadata.protocol != PROTOCOL:
        raise EnvServerUnavailable(
            f"the env server at {base} answered the metadata of {metadata.id!r} ({metadata.protocol}) for {env_id!r}"
        )
    return metadata


def _spec_of(metadata: Any, where: str, endpoint: Callable[[], Any], source: str) -> RemoteEnvSpec:
    try:
        return RemoteEnvSpec.served(metadata.spec, metadata.hash, where, endpoint)
    except ValidationError as exc:
        raise EnvServerUnavailable(
            f"{source}: the server's spec of {metadata.id!r} is not a valid EnvSpec: {exc}"
        ) from None


def _get_json(base: str, path: str, what: str, model: Any) -> Any:
    import httpx

    url = base + path
    try:
        response = httpx.get(url, timeout=HTTP_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise EnvServerUnavailable(
            f"nothing answers at {base} ({type(exc).__name__}: {exc}); start the env server with "
            "`molt-env serve-env ID --port PORT`, or check the URL"
        ) from None
    body = response.text
    if response.status_code != 200:
        raise EnvServerUnavailable(
            f"{url} answered HTTP {response.status_code} ({body[:120]!r}); is {base} an env server "
            "(`molt-env serve-env`)?"
        )
    try:
        data = response.json()
        model.model_validate(data)
    except (ValueError, ValidationError):
        raise EnvServerUnavailable(
            f"{url} answered {body[:160]!r}, which is not an env server's {what}; is {base} an env server "
            "(`molt-env serve-env`)?"
        ) from None
    return data


def factory(spec: RemoteEnvSpec) -> Callable[[], Any]:
    """A function making a fresh client instance per episode (``RemoteEnv``, or ``RemoteChatAgent``)."""
    from molt_envs.remote_env import RemoteChatAgent, RemoteEnv

    endpoint = spec.endpoint()
    cls = RemoteChatAgent if spec.kind == "chat_agent" else RemoteEnv

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
