"""benchmarks/turn_counter.py counts one turn per wait for the server (the benchmark's
round trips per call on PostgreSQL rest on it)."""

from __future__ import annotations

import psycopg
from conftest import load_benchmark_module, postgres_database_url, require_postgres


def test_one_turn_per_statement_begin_and_commit_included() -> None:
    require_postgres()
    url = postgres_database_url()
    with load_benchmark_module("turn_counter").TurnCounter(
        url.host or "127.0.0.1", url.port or 5432
    ) as proxy:
        conninfo = proxy.url(url.set(drivername="postgresql").render_as_string(False))
        with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as connection:
            before = proxy.count()
            connection.execute("SELECT 1").fetchone()
            assert proxy.count() - before == 1
            # A large statement (many TCP segments) is still one turn.
            before = proxy.count()
            connection.execute("SELECT %s::text", ["x" * 1_000_000]).fetchone()
            assert proxy.count() - before == 1
            connection.autocommit = False
            before = proxy.count()
            connection.execute("SELECT 1").fetchone()  # BEGIN, then the statement
            connection.commit()
            assert proxy.count() - before == 3
