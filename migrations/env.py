"""The checkout's Alembic environment (alembic.ini); the installed package's is
relay_flow_projection/migrations/env.py. All logic lives in the package."""

from alembic import context

from relay_flow_projection.migration_env import run

run(context)  # type: ignore[arg-type]  # the module proxies the EnvironmentContext
