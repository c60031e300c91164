"""Executor identity validation (before any database access)."""

from __future__ import annotations

from .errors import InvalidIdentity
from .models import ExecutorIdentity
from .validation import plain_text

EXECUTOR_PLUGINS = ("goworkflows", "temporal")


def validate_identity(identity: ExecutorIdentity) -> None:
    if not isinstance(identity, ExecutorIdentity):
        raise InvalidIdentity(f"expected an ExecutorIdentity, got {type(identity).__name__}")
    for name in ("executor_plugin", "temporal_address", "temporal_namespace"):
        # Text the databases can store: a str, no NUL, no lone surrogate.
        try:
            plain_text(getattr(identity, name), name, key=False)
        except (TypeError, ValueError) as exc:
            raise InvalidIdentity(str(exc)) from None
    plugin = identity.executor_plugin
    if plugin == "goworkflows":
        if identity.temporal_address or identity.temporal_namespace:
            raise InvalidIdentity(
                "goworkflows identity must not contain a Temporal address or namespace"
            )
    elif plugin == "temporal":
        if not identity.temporal_address.strip() or not identity.temporal_namespace.strip():
            raise InvalidIdentity("temporal identity requires a non-blank address and namespace")
    else:
        raise InvalidIdentity(
            # At most 40 characters of the given name: a message never echoes a megabyte.
            f"unknown executor plugin {plugin[:40]!r} "
            f"(expected one of: {', '.join(EXECUTOR_PLUGINS)})"
        )
