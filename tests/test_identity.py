"""The executor identity marker: identity / initialize_identity / verify_identity."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from relay_flow_projection import (
    ExecutorIdentity,
    IdentityMismatch,
    IdentityMissing,
    InvalidIdentity,
    ProjectionError,
    RunProjection,
    init_database_with_identity,
)

Rows = Callable[[str], list[tuple[object, ...]]]

EMBEDDED = ExecutorIdentity("goworkflows")
TEMPORAL = ExecutorIdentity("temporal", "temporal.internal:7233", "relay")
OTHER_TEMPORAL = [
    ExecutorIdentity("temporal", "temporal.internal:7233", "relay-staging"),
    ExecutorIdentity("temporal", "other.internal:7233", "relay"),
    ExecutorIdentity("temporal", "temporal.internal:7233 ", "relay"),
]

INVALID = [
    pytest.param(ExecutorIdentity("goworkflows", "temporal:7233", ""), id="goworkflows-address"),
    pytest.param(ExecutorIdentity("goworkflows", "", "ns"), id="goworkflows-namespace"),
    pytest.param(ExecutorIdentity("goworkflows", " ", ""), id="goworkflows-blank-address"),
    pytest.param(ExecutorIdentity("temporal", "", "ns"), id="temporal-no-address"),
    pytest.param(ExecutorIdentity("temporal", "host:7233", ""), id="temporal-no-namespace"),
    pytest.param(ExecutorIdentity("temporal", "   ", "ns"), id="temporal-blank-address"),
    pytest.param(ExecutorIdentity("temporal", "host:7233", "\t "), id="temporal-blank-namespace"),
    pytest.param(ExecutorIdentity("temporal"), id="temporal-nothing"),
    pytest.param(ExecutorIdentity("cadence", "host:7233", "ns"), id="unknown-plugin"),
    pytest.param(ExecutorIdentity(""), id="empty-plugin"),
    pytest.param(ExecutorIdentity("GoWorkflows"), id="plugin-case"),
    pytest.param(ExecutorIdentity("goworkflows "), id="plugin-trailing-space"),
]


# ---------------------------------------------------------------- identity() ---


def test_identity_is_none_initially(projection: RunProjection) -> None:
    assert projection.identity() is None


@pytest.mark.parametrize("identity", [EMBEDDED, TEMPORAL], ids=["goworkflows", "temporal"])
def test_initialize_identity_inserts_the_marker(
    projection: RunProjection, table_rows: Rows, identity: ExecutorIdentity
) -> None:
    projection.initialize_identity(identity)

    assert projection.identity() == identity
    assert len(table_rows("relay_executor_identity")) == 1


def test_goworkflows_marker_stores_null_address_and_namespace(
    projection: RunProjection, table_rows: Rows
) -> None:
    projection.initialize_identity(EMBEDDED)
    assert table_rows("relay_executor_identity") == [(1, "goworkflows", None, None)]
    assert projection.identity() == ExecutorIdentity("goworkflows", "", "")


@pytest.mark.parametrize("identity", [EMBEDDED, TEMPORAL], ids=["goworkflows", "temporal"])
def test_initialize_identity_again_with_the_same_is_ok(
    projection: RunProjection, table_rows: Rows, identity: ExecutorIdentity
) -> None:
    projection.initialize_identity(identity)
    before = table_rows("relay_executor_identity")

    projection.initialize_identity(identity)
    projection.initialize_identity(ExecutorIdentity(*_fields(identity)))

    assert table_rows("relay_executor_identity") == before


def _fields(identity: ExecutorIdentity) -> tuple[str, str, str]:
    return identity.executor_plugin, identity.temporal_address, identity.temporal_namespace


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (EMBEDDED, TEMPORAL),
        (TEMPORAL, EMBEDDED),
        *((TEMPORAL, other) for other in OTHER_TEMPORAL),
    ],
)
def test_initialize_identity_with_a_different_one_raises_and_keeps_the_marker(
    projection: RunProjection,
    table_rows: Rows,
    first: ExecutorIdentity,
    second: ExecutorIdentity,
) -> None:
    projection.initialize_identity(first)
    before = table_rows("relay_executor_identity")

    with pytest.raises(IdentityMismatch) as info:
        projection.initialize_identity(second)

    assert isinstance(info.value, ProjectionError)
    assert table_rows("relay_executor_identity") == before
    assert projection.identity() == first


# ------------------------------------------------------------ verify_identity ---


def test_verify_without_marker_adopts_goworkflows(
    projection: RunProjection, table_rows: Rows
) -> None:
    projection.verify_identity(EMBEDDED)

    assert projection.identity() == EMBEDDED
    assert table_rows("relay_executor_identity") == [(1, "goworkflows", None, None)]
    projection.verify_identity(EMBEDDED)  # and it verifies from now on
    with pytest.raises(IdentityMismatch):
        projection.verify_identity(TEMPORAL)


def test_verify_without_marker_for_temporal_raises_missing(
    projection: RunProjection, table_rows: Rows
) -> None:
    with pytest.raises(IdentityMissing) as info:
        projection.verify_identity(TEMPORAL)

    assert isinstance(info.value, ProjectionError)
    assert table_rows("relay_executor_identity") == []
    assert projection.identity() is None


@pytest.mark.parametrize("identity", [EMBEDDED, TEMPORAL], ids=["goworkflows", "temporal"])
def test_verify_matching_marker_passes_and_changes_nothing(
    projection: RunProjection, table_rows: Rows, identity: ExecutorIdentity
) -> None:
    projection.initialize_identity(identity)
    before = table_rows("relay_executor_identity")

    projection.verify_identity(identity)

    assert table_rows("relay_executor_identity") == before


@pytest.mark.parametrize(
    ("persisted", "configured"),
    [
        (EMBEDDED, TEMPORAL),
        (TEMPORAL, EMBEDDED),
        *((TEMPORAL, other) for other in OTHER_TEMPORAL),
    ],
)
def test_verify_mismatch_raises_and_keeps_the_marker(
    projection: RunProjection,
    table_rows: Rows,
    persisted: ExecutorIdentity,
    configured: ExecutorIdentity,
) -> None:
    projection.initialize_identity(persisted)
    before = table_rows("relay_executor_identity")

    with pytest.raises(IdentityMismatch):
        projection.verify_identity(configured)

    assert table_rows("relay_executor_identity") == before


def test_identity_marker_is_independent_of_runs(
    projection: RunProjection, table_rows: Rows
) -> None:
    projection.initialize_identity(TEMPORAL)
    assert table_rows("relay_runs") == []
    assert projection.list_runs() == []


# ------------------------------------------------------------ invalid identity ---


@pytest.mark.parametrize("identity", INVALID)
def test_invalid_identity_is_refused(
    projection: RunProjection, table_rows: Rows, identity: ExecutorIdentity
) -> None:
    with pytest.raises(InvalidIdentity) as info:
        projection.initialize_identity(identity)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ProjectionError)
    with pytest.raises(InvalidIdentity):
        projection.verify_identity(identity)
    assert table_rows("relay_executor_identity") == []


@pytest.mark.parametrize("identity", INVALID)
def test_invalid_identity_is_refused_even_when_a_marker_exists(
    projection: RunProjection, table_rows: Rows, identity: ExecutorIdentity
) -> None:
    projection.initialize_identity(TEMPORAL)
    with pytest.raises(InvalidIdentity):
        projection.initialize_identity(identity)
    with pytest.raises(InvalidIdentity):
        projection.verify_identity(identity)
    assert projection.identity() == TEMPORAL


class Unreachable(AssertionError):
    """Raised by an engine that must never be asked for a connection."""


@pytest.fixture
def unusable_engine(dialect: str) -> Iterator[tuple[Engine, list[int]]]:
    """An engine of the parametrized dialect whose every connection attempt fails, counted."""
    attempts: list[int] = []

    def creator() -> object:
        attempts.append(1)
        raise Unreachable("the identity check touched the database")

    url = "postgresql+psycopg://" if dialect == "postgresql" else "sqlite://"
    engine = sa.create_engine(url, creator=creator)
    yield engine, attempts
    engine.dispose()


@pytest.mark.parametrize("identity", INVALID)
def test_invalid_identity_is_refused_before_any_database_access(
    unusable_engine: tuple[Engine, list[int]], identity: ExecutorIdentity
) -> None:
    engine, attempts = unusable_engine
    projection = RunProjection(engine)

    with pytest.raises(InvalidIdentity):
        projection.initialize_identity(identity)
    with pytest.raises(InvalidIdentity):
        projection.verify_identity(identity)

    assert attempts == []


def test_the_unusable_engine_really_is_unusable(
    unusable_engine: tuple[Engine, list[int]],
) -> None:
    """Guard for the test above: a valid identity does reach (and fail at) the database."""
    engine, attempts = unusable_engine
    projection = RunProjection(engine)
    with pytest.raises(Unreachable):
        projection.verify_identity(EMBEDDED)
    assert attempts


@pytest.mark.parametrize("identity", INVALID)
def test_init_database_with_invalid_identity_creates_nothing(
    db_url: str, dialect: str, identity: ExecutorIdentity
) -> None:
    with pytest.raises(InvalidIdentity):
        init_database_with_identity(db_url, identity)

    if dialect == "sqlite":
        assert not Path(db_url).exists()
    else:
        engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
        try:
            assert sa.inspect(engine).get_table_names() == []
        finally:
            engine.dispose()
