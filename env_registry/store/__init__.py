"""A registry's data: the local store (release files under a directory, their records in one SQLAlchemy database on
SQLite or PostgreSQL, with its alembic migrations), tokens and sessions, eval summaries, validation states, and the
HTTP client of a remote registry that answers the same calls (``open_registry``).

May import: ``packages`` and the top of ``env_registry``. Never ``hub``, ``installs``, ``evaluation`` or ``validation``.
"""
