"""Who may do what over HTTP: credentials (publish tokens, the hub's session cookie), the read rule of private
servers, and the HTTP status of each registry error. The JSON API, the index and the hub's pages share them."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from env_registry.errors import Error, UnregisteredEnv
from env_registry.store.local import Conflict, Forbidden, NotFound

SESSION_COOKIE = "molt_session"
TOKEN_NEEDED = (
    "this needs a token: send 'Authorization: Bearer <token>' (mint one with "
    "`molt-env token mint --root <registry root> --publisher <name>`)"
)


class Unauthorized(Error):
    """No credentials were sent (HTTP 401)."""


STATUS = {Unauthorized: 401, NotFound: 404, UnregisteredEnv: 404, Conflict: 409, Forbidden: 403}  # others: 400


bearer = HTTPBearer(auto_error=False, description="a publish token from `molt-env token mint`")


def publisher(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
    """The publisher of the request's token: 401 without a token, 403 with an unknown or revoked one."""
    token = credentials.credentials if credentials else request_token(request)
    if not token:
        raise Unauthorized(TOKEN_NEEDED)
    found = request.app.state.registry.token_publisher(token)
    if found is None:
        raise Forbidden("the token is unknown or revoked; mint a new one with `molt-env token mint`")
    return found


def reader(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """Open reading, unless the server is private: then any active token may read, or a hub login session."""
    if request.app.state.private and not logged_in(request):
        publisher(request, credentials)


def principal(request: Request, private: bool) -> tuple[str, str] | None:
    """Who a read is answered for, by the rule of ``reader`` (what the page cache keys on): ``("session", publisher)``
    for a hub login, ``("token", publisher)`` for a token on a private server, None for an anonymous read of a
    public server.

    Raises:
        Unauthorized: a private server, and neither a session nor a token.
        Forbidden: a private server, and an unknown or revoked token.
    """
    viewer = logged_in(request)
    if viewer is not None:
        return ("session", viewer)
    if not private:
        return None
    return ("token", publisher(request, None))


def logged_in(request: Request) -> str | None:
    """The publisher of the request's unexpired hub session cookie, or None."""
    session = request.cookies.get(SESSION_COOKIE)
    return request.app.state.registry.session_publisher(session) if session else None


Reader = Annotated[None, Depends(reader)]
Publisher = Annotated[str, Depends(publisher)]


def request_token(request: Request) -> str | None:
    """The token a request carries: ``Authorization: Bearer <token>``, or HTTP Basic with the token as password."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(value, validate=True).decode().partition(":")[2] or None
    except (binascii.Error, UnicodeDecodeError):
        return None
