"""`alembic upgrade head` killed at any point completes when it is run again.

MySQL/MariaDB commit each DDL statement: a revision killed half-way leaves
its first steps behind with ``alembic_version`` unchanged, and the next
upgrade runs it again from its first statement (frozen_v1's re-runnable
steps find what is done). SQLite and PostgreSQL roll the killed revision back.

Each round starts an upgrade in a process of its own -- slowed down before
every statement, so that a kill at a random moment lands inside a revision
rather than between two -- and SIGKILLs it. Rounds go on until an upgrade
finishes by itself; then the deployer's command (`alembic upgrade head`,
then `alembic check` with the two-line alembic.ini) must find the schema at
head, exactly.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from conftest import deployed_alembic
from sqlalchemy.pool import NullPool

from relay_flow_projection.engine import resolve_target
from relay_flow_projection.migrate import head_revision

# Each statement waits this long first: the empty chain's ~25 statements then
# take about a second, which the kills fall inside.
PAUSE = 0.04
SLOW_UPGRADE = f"""
import sys, time
from sqlalchemy import event
from sqlalchemy.engine import Engine
from relay_flow_projection import migrate

@event.listens_for(Engine, "before_cursor_execute")
def _pause(*_args):
    time.sleep({PAUSE})

print("ready", flush=True)
migrate.run_upgrade(sys.argv[1])
"""


def _state(url: str) -> tuple[str | None, int, int]:
    """(version row, relay tables, indexes on relay_runs) as the killed upgrade left them."""
    engine = sa.create_engine(resolve_target(url).url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            inspector = sa.inspect(connection)
            tables = [t for t in inspector.get_table_names() if t.startswith("relay_")]
            indexes = len(inspector.get_indexes("relay_runs")) if "relay_runs" in tables else 0
            version = None
            if inspector.has_table("alembic_version"):
                version = connection.exec_driver_sql(
                    "SELECT version_num FROM alembic_version"
                ).scalar()
            return version, len(tables), indexes
    finally:
        engine.dispose()


def _kill_once(url: str, delay: float) -> bool:
    """Start a slowed upgrade, SIGKILL it *delay* s after it is ready; True if it
    finished first."""
    upgrader = subprocess.Popen(
        [sys.executable, "-c", SLOW_UPGRADE, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert upgrader.stdout is not None
    assert upgrader.stdout.readline().strip() == "ready"
    try:
        upgrader.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        os.kill(upgrader.pid, signal.SIGKILL)
        upgrader.communicate(timeout=30)  # reaps it and closes the pipes
        return False
    _, errors = upgrader.communicate(timeout=30)
    assert upgrader.returncode == 0, errors
    return True


def test_upgrade_killed_mid_revision_completes_when_run_again(
    db_url: str, dialect: str, deployer: Path
) -> None:
    url = db_url if "://" in db_url else f"sqlite:///{db_url}"
    chance = random.Random(20261206)
    left_behind: list[tuple[str | None, int, int]] = []
    for _ in range(12):
        if _kill_once(url, chance.uniform(0.05, 1.2)):
            break
        left_behind.append(_state(url))
    kills = len(left_behind)
    # Killed mid-chain several times, in states that differ from each other.
    assert kills >= 3, left_behind
    assert len(set(left_behind)) >= 2, left_behind

    for command in (["upgrade", "head"], ["check"]):
        done = deployed_alembic(url, deployer, *command)
        assert done.returncode == 0, done.stdout + done.stderr
    assert _state(url)[0] == head_revision()
    print(
        f"\nkilled upgrades[{dialect}]: {kills} kills, leaving (version, tables, indexes) "
        f"{sorted(set(left_behind), key=str)}; the next upgrade reached head, check clean"
    )
