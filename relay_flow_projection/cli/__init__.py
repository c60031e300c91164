"""The operator command line: ``relay-flow-projection`` or ``python -m relay_flow_projection``."""

from .app import cli, main

__all__ = ["cli", "main"]
