"""Alembic environment of relay_flow_projection: all logic lives in the package."""

from alembic import context

from relay_flow_projection.migration_env import run

run(context)  # type: ignore[arg-type]  # the module proxies the EnvironmentContext
