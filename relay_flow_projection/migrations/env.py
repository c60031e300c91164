"""Alembic environment of ``script_location = relay_flow_projection:migrations``.

All logic lives in relay_flow_projection.migration_env (typed, tested).
"""

from alembic import context

from relay_flow_projection.migration_env import run

run(context)  # type: ignore[arg-type]  # the module proxies the EnvironmentContext
