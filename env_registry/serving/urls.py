"""Env servers by URL: ``make("http://host:port/ns/name-v1")`` (the ``http`` and ``https`` schemes of the registry).

``url_spec`` checks that the URL is an env server speaking this client's protocol and serving that ID, and returns its
``RemoteEnvSpec``. Every failure to reach a server is an ``EnvServerUnavailable`` naming the URL and what to do.

URL options (query string): ``timeout_s`` bounds each reset/step answer (default ``$MOLT_ENV_TIMEOUT_S`` or 300).
The server's ``max_episodes`` (``serve-env --max-episodes N``) bounds the episodes this process opens there at once:
the others wait for a slot (``molt_envs.remote.client.EpisodeSlots``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import ValidationError

from env_registry.errors import EnvServerUnavailable, InvalidEnvId
from env_registry.ids import parse_env_id
from env_registry.remote import HTTP_TIMEOUT_S, RemoteEnvSpec
from env_registry.sources import Source

_CONNECTED: dict[str, RemoteEnvSpec] = {}
_LOCK = threading.Lock()


class EnvServerURLs(Source):
    """The ``molt.sources`` entry of env server URLs."""

    schemes = ("http", "https")

    def spec(self, env_id: str) -> RemoteEnvSpec:
        return url_spec(env_id)


SOURCE = EnvServerURLs()


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
    from molt_envs.remote.client import TIMEOUT_S, Endpoint

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
    endpoint = Endpoint(base, env_id.unpinned, timeout_s=timeout_s, capacity=metadata.max_episodes)
    return _spec_of(metadata, f"the env server at {base}", lambda: endpoint, url)


def check_server(base: str, env_id: str) -> Any:
    """``/health`` and ``/<env id>/metadata`` of the server at ``base``, validated; returns the ``Metadata``."""
    from molt_envs.remote.protocol import PROTOCOL, Health, Metadata

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
