"""Identity races on SQLite: several processes initialize one new file at once.

Each racer calls ``init_database_with_identity`` on the same absent file with
its own Temporal namespace, released together by a barrier. Exactly one
marker is written; the winner returns, every other racer gets
IdentityMismatch (never a lock error, never "table already exists" from
running the migration chain twice). Then racers that all carry the winner's
identity succeed together. (PostgreSQL: tests/test_postgresql.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

import pytest
from reliability_support import SPAWN, scaled
from reliability_workers import async_identity_racer, identity_racer

from relay_flow_projection import ExecutorIdentity, open_projection
from relay_flow_projection.migrate import head_revision

pytestmark = pytest.mark.sqlite_only

RACERS = 6


def _race(
    pool: Pool,
    barrier_factory: Any,
    target: str,
    identities: list[tuple[str, str, str]],
    racer: Any = identity_racer,
) -> list[tuple[tuple[str, str, str], str, str]]:
    barrier = barrier_factory(len(identities))
    pending = [
        (identity, pool.apply_async(racer, (target, identity, barrier))) for identity in identities
    ]
    return [(identity, *result.get(timeout=180)) for identity, result in pending]


@pytest.fixture(scope="module")
def racers() -> Iterator[tuple[Pool, Any]]:
    """RACERS processes started once and reused by every round, plus a shared Barrier."""
    with SPAWN.Manager() as manager, SPAWN.Pool(RACERS) as pool:
        yield pool, manager.Barrier


# The asyncio facade races the same way: open_async_projection runs the chain,
# then initialize_identity (the same operation as the sync facade's).
@pytest.mark.parametrize("racer", [identity_racer, async_identity_racer], ids=["sync", "async"])
def test_racing_initializers_write_one_marker(
    tmp_path: Path, racers: tuple[Pool, Any], racer: Any
) -> None:
    rounds = scaled(5)
    for round_number in range(rounds):
        target = str(tmp_path / f"race-{round_number}.db")
        identities = [
            ("temporal", "temporal.internal:7233", f"namespace-{index}") for index in range(RACERS)
        ]
        outcomes = _race(*racers, target, identities, racer)
        assert len(outcomes) == RACERS
        winners = [identity for identity, outcome, _ in outcomes if outcome == "ok"]
        losers = [outcome for _, outcome, _ in outcomes if outcome != "ok"]
        assert len(winners) == 1, outcomes
        assert losers == ["IdentityMismatch"] * (RACERS - 1), outcomes

        projection = open_projection(target)  # at head, no upgrade needed
        try:
            assert projection.identity() == ExecutorIdentity(*winners[0])
            with projection.engine.connect() as connection:
                markers = connection.exec_driver_sql(
                    "SELECT count(*) FROM relay_executor_identity"
                ).scalar_one()
                versions = (
                    connection.exec_driver_sql("SELECT version_num FROM alembic_version")
                    .scalars()
                    .all()
                )
            assert markers == 1
            assert versions == [head_revision()]
        finally:
            projection.engine.dispose()

        # The same identity from every racer at once: all succeed.
        again = _race(*racers, target, [winners[0]] * RACERS, racer)
        assert [outcome for _, outcome, _ in again] == ["ok"] * RACERS, again
    print(
        f"\nidentity race[sqlite, {racer.__name__}]: {rounds} rounds x {RACERS} processes: "
        f"{rounds} markers written, {rounds * (RACERS - 1)} IdentityMismatch, "
        f"{rounds * RACERS} same-identity initializers succeeded, 0 other errors"
    )
