"""The Alembic chain inside the package: ``relay_flow_projection:migrations`` to Alembic.

A package (not only a directory) so that revisions can import the frozen
helpers of :mod:`relay_flow_projection.migrations.frozen_v1` by a stable name,
and so that this ``env.py`` has a module name of its own for mypy.
"""
