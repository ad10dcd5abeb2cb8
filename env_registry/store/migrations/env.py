"""alembic's entry point for the registry's migrations: always handed an open connection by
``env_registry.store.database.migrate`` (which holds the registry's write lock around it)."""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None)
with context.begin_transaction():
    context.run_migrations()
