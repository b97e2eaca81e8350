"""Alembic environment: runs against the Engine that bench.store.open_store hands over."""

from alembic import context

from bench.store.schema import Base

engine = context.config.attributes["engine"]
with engine.begin() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    context.run_migrations()
