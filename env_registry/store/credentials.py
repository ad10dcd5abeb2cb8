"""Publish tokens and the hub's login sessions of a registry database.

Both are stored as sha256 digests only: a token is shown once, when it is minted; a session is the value of an
HttpOnly cookie that the login form sets. A session lives ``SESSION_SECONDS`` and ends with its token's revocation.
"""

from __future__ import annotations

import hashlib
import secrets
import time

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from env_registry.packages import names
from env_registry.store import database
from env_registry.store.database import sessions, tokens
from env_registry.store.records import NotFound, TokenInfo

TOKEN_PREFIX = "molt_"
SESSION_SECONDS = 12 * 3600


class Credentials:
    """The token and session calls of ``LocalRegistry`` (which supplies ``engine``)."""

    engine: Engine

    def mint_token(self, publisher: str) -> tuple[int, str]:
        """A new token for ``publisher``: ``(id, token)``; only its digest is stored."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with database.write(self.engine, exclusive=False, stamp=None) as db:
            result = db.execute(
                tokens.insert().values(
                    publisher=names.publisher_name(publisher), digest=_digest(token), created=time.time()
                )
            )
        return int(result.inserted_primary_key[0]), token

    def revoke_token(self, token_id: int) -> TokenInfo:
        """Revoke a token (and end its login sessions).

        Raises:
            NotFound: no active token has that id.
        """
        with database.write(self.engine, stamp=None) as db:
            revoked = db.execute(
                tokens.update().where(tokens.c.id == token_id, tokens.c.revoked.is_(None)).values(revoked=time.time())
            )
            if revoked.rowcount == 0:
                raise NotFound(f"no active token with id {token_id}; see `molt-env token list`")
            db.execute(sessions.delete().where(sessions.c.token_id == token_id))
        return next(t for t in self.tokens() if t.id == token_id)

    def tokens(self) -> list[TokenInfo]:
        """Every token ever minted, active or revoked."""
        with database.read(self.engine) as db:
            rows = db.execute(
                sa.select(tokens.c.id, tokens.c.publisher, tokens.c.created, tokens.c.revoked).order_by(tokens.c.id)
            ).all()
        return [TokenInfo(**r._asdict()) for r in rows]

    def token_publisher(self, token: str) -> str | None:
        """The publisher of an active token, or None."""
        with database.read(self.engine) as db:
            return db.execute(
                sa.select(tokens.c.publisher).where(tokens.c.digest == _digest(token), tokens.c.revoked.is_(None))
            ).scalar()

    def open_session(self, token: str) -> str | None:
        """A new login session for an active token: the cookie value, or None when the token is not active."""
        session = secrets.token_urlsafe(32)
        now = time.time()
        with database.write(self.engine, exclusive=False, stamp=None) as db:
            token_id = db.execute(
                sa.select(tokens.c.id).where(tokens.c.digest == _digest(token), tokens.c.revoked.is_(None))
            ).scalar()
            if token_id is None:
                return None
            db.execute(sessions.delete().where(sessions.c.expires < now))
            db.execute(
                sessions.insert().values(
                    digest=_digest(session), token_id=token_id, created=now, expires=now + SESSION_SECONDS
                )
            )
        return session

    def session_publisher(self, session: str) -> str | None:
        """The publisher behind an unexpired session whose token is still active, or None."""
        with database.read(self.engine) as db:
            return db.execute(
                sa.select(tokens.c.publisher)
                .join(sessions, sessions.c.token_id == tokens.c.id)
                .where(
                    sessions.c.digest == _digest(session),
                    sessions.c.expires > time.time(),
                    tokens.c.revoked.is_(None),
                )
            ).scalar()

    def close_session(self, session: str) -> None:
        """End a login session (logging out)."""
        with database.write(self.engine, exclusive=False, stamp=None) as db:
            db.execute(sessions.delete().where(sessions.c.digest == _digest(session)))


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
