"""Shared fixtures: every test that is not SQLite-specific runs on SQLite, PostgreSQL
and MariaDB (the "mysql" dialect).

``db_url`` is parametrized over the three; each test gets a fresh SQLite file,
a fresh PostgreSQL schema (``search_path`` set through the URL, so the Alembic
chain and the repository run unqualified, as in production) or a fresh
MySQL/MariaDB database.

PostgreSQL comes from ``$RELAY_FLOW_TEST_POSTGRES_URL`` or the machine's server
on 127.0.0.1:5432 (user postgres, trust auth); MySQL/MariaDB from
``$RELAY_FLOW_TEST_MYSQL_URL`` or the machine's server on 127.0.0.1:3306 (user
root, no password). Without a reachable server those cases skip with the
reason; with ``CI=true`` they fail instead. Each MySQL test database is made
with a case-folding, space-padding collation (``utf8mb4_general_ci``, the
server default here), so that nothing passes by relying on a kinder default.

The functional suite (every test using ``projection``) also runs on
PostgreSQL through a private PgBouncer in transaction pooling mode (the
``route`` parameter, tests/pgbouncer.py); without ``pgbouncer`` installed
those cases skip, and fail under ``CI=true``.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pytest
import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.config import Config as AlembicConfig
from async_adapter import BlockingAsyncProjection, LoopThread
from fakes import FakeClock
from pgbouncer import PgBouncer, pgbouncer_binary
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import NullPool

from relay_flow_projection import (
    AsyncRunProjection,
    RunProjection,
    create_async_engine,
    create_engine,
    upgrade,
)
from relay_flow_projection.engine import build_engine, resolve_target
from relay_flow_projection.migrate import alembic_config as migration_config
from relay_flow_projection.schema import metadata as schema_metadata

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
# A database of this session's own (a schema per test inside it), dropped at
# the end: other runs may share the server, and nothing accumulates between
# runs for a later one to trip over.
TEST_DATABASE = f"relay_fp_test_{uuid.uuid4().hex[:12]}"
DEFAULT_MYSQL_URL = "mysql+pymysql://root@127.0.0.1:3306/"
DIALECTS = ("sqlite", "postgresql", "mysql")
# How PostgreSQL is reached; RELAY_FLOW_TEST_ROUTES=direct leaves PgBouncer out
# (.ci/run's run on the lowest declared versions does).
ROUTES = tuple(os.environ.get("RELAY_FLOW_TEST_ROUTES", "direct,pgbouncer").split(","))
if not set(ROUTES) <= {"direct", "pgbouncer"}:
    raise ValueError(f"RELAY_FLOW_TEST_ROUTES: direct and/or pgbouncer, not {ROUTES}")


def _admin_url() -> sa.URL:
    return make_url(os.environ.get("RELAY_FLOW_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL))


@cache
def postgres_unavailable() -> str | None:
    """None when the test database is reachable (created on first use), else the reason."""
    admin = _admin_url()
    try:
        engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        with engine.connect() as connection:
            exists = connection.execute(
                sa.text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": TEST_DATABASE}
            ).first()
            if exists is None:
                connection.exec_driver_sql(f'CREATE DATABASE "{TEST_DATABASE}"')
        engine.dispose()
    except Exception as exc:  # any failure to reach the server is a reason to skip
        return f"PostgreSQL at {admin.render_as_string()} is unreachable: {exc}".splitlines()[0]
    return None


def require_postgres() -> None:
    skip_or_fail(postgres_unavailable())


def skip_or_fail(reason: str | None) -> None:
    """Skip with *reason*, or fail under CI=true, where nothing may skip for a missing server."""
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def postgres_database_url() -> sa.URL:
    return _admin_url().set(database=TEST_DATABASE)


@dataclass
class PostgresSchemas:
    """Creates a schema per test and drops them all at the end of the session."""

    created: list[str] = field(default_factory=list)
    bouncer: PgBouncer | None = None

    def new_url(self, route: str = "direct") -> str:
        """A fresh schema, reached directly or through the session's PgBouncer."""
        require_postgres()
        schema = f"t_{uuid.uuid4().hex[:16]}"
        base = postgres_database_url()
        engine = sa.create_engine(base, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        with engine.connect() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        engine.dispose()
        self.created.append(schema)
        if route == "pgbouncer":
            return self._pgbouncer().alias(schema, schema)
        url = base.update_query_dict({"options": f"-csearch_path={schema}"})
        return url.render_as_string(hide_password=False)

    def schema_of(self, url: str) -> str:
        """The schema a URL of new_url() reaches, directly or through PgBouncer."""
        parsed = make_url(url)
        options = parsed.query.get("options")
        if isinstance(options, str) and options.startswith("-csearch_path="):
            return options.removeprefix("-csearch_path=")
        assert parsed.database in self.created, url  # a PgBouncer alias is named after it
        return parsed.database

    def direct_url(self, url: str) -> str:
        """The direct URL of the schema a PgBouncer URL of new_url() reaches."""
        schema = make_url(url).database
        options = {"options": f"-csearch_path={schema}"}
        return postgres_database_url().update_query_dict(options).render_as_string(False)

    def _pgbouncer(self) -> PgBouncer:
        if self.bouncer is None:
            skip_or_fail(None if pgbouncer_binary() else "pgbouncer is not installed")
            base = postgres_database_url()
            bouncer = PgBouncer(
                server_host=base.host or "127.0.0.1",
                server_port=base.port or 5432,
                user=base.username or "postgres",
                database=base.database or TEST_DATABASE,
            )
            bouncer.start()
            self.bouncer = bouncer
        return self.bouncer

    def drop_all(self) -> None:
        if self.bouncer is not None:
            self.bouncer.stop()
        if not self.created or postgres_unavailable() is not None:
            return
        engine = sa.create_engine(_admin_url(), isolation_level="AUTOCOMMIT", poolclass=NullPool)
        with engine.connect() as connection:
            # FORCE: a worker process a failed test left behind must not keep it alive.
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{TEST_DATABASE}" WITH (FORCE)')
        engine.dispose()


@pytest.fixture(scope="session")
def postgres_schemas() -> Iterator[PostgresSchemas]:
    schemas = PostgresSchemas()
    yield schemas
    schemas.drop_all()


def _mysql_admin_url() -> sa.URL:
    return make_url(os.environ.get("RELAY_FLOW_TEST_MYSQL_URL", DEFAULT_MYSQL_URL))


@cache
def mysql_unavailable() -> str | None:
    """None when the MySQL/MariaDB server answers, else the reason."""
    admin = _mysql_admin_url()
    try:
        engine = sa.create_engine(admin, poolclass=NullPool)
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
        engine.dispose()
    except Exception as exc:  # any failure to reach the server is a reason to skip
        return f"MySQL at {admin.render_as_string()} is unreachable: {exc}".splitlines()[0]
    return None


def require_mysql() -> None:
    skip_or_fail(mysql_unavailable())


@dataclass
class MySQLDatabases:
    """Creates a database per test and drops them all at the end of the session."""

    created: list[str] = field(default_factory=list)
    prefix: str = field(default_factory=lambda: f"relay_fp_{uuid.uuid4().hex[:8]}")

    def new_url(self) -> str:
        require_mysql()
        name = f"{self.prefix}_{len(self.created)}"
        self._admin(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
        self.created.append(name)
        return _mysql_admin_url().set(database=name).render_as_string(hide_password=False)

    def _admin(self, *statements: str) -> None:
        engine = sa.create_engine(_mysql_admin_url(), poolclass=NullPool)
        try:
            with engine.connect() as connection:
                for statement in statements:
                    connection.exec_driver_sql(statement)
        finally:
            engine.dispose()

    def drop_all(self) -> None:
        if self.created and mysql_unavailable() is None:
            self._admin(*(f"DROP DATABASE IF EXISTS `{name}`" for name in self.created))


@pytest.fixture(scope="session")
def mysql_databases() -> Iterator[MySQLDatabases]:
    databases = MySQLDatabases()
    yield databases
    databases.drop_all()


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def route() -> str:
    """How PostgreSQL is reached: "direct", or "pgbouncer" for the functional suite."""
    return "direct"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "projection" in metafunc.fixturenames:
        metafunc.parametrize("route", ROUTES)


@pytest.fixture
def db_url(
    dialect: str,
    route: str,
    tmp_path: Path,
    postgres_schemas: PostgresSchemas,
    mysql_databases: MySQLDatabases,
) -> str:
    """An empty database of the parametrized dialect, as a target string."""
    if dialect == "postgresql":
        return postgres_schemas.new_url(route)
    if dialect == "mysql":
        return mysql_databases.new_url()
    return str(tmp_path / "projection.db")


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    """An (absent) SQLite file for SQLite-only tests."""
    return tmp_path / "projection.db"


@pytest.fixture
def postgres_url(postgres_schemas: PostgresSchemas) -> str:
    """An empty PostgreSQL schema for PostgreSQL-only tests."""
    return postgres_schemas.new_url()


@pytest.fixture
def mysql_url(mysql_databases: MySQLDatabases) -> str:
    """An empty MySQL/MariaDB database for MySQL-only tests."""
    return mysql_databases.new_url()


@pytest.fixture
def migrated_url(db_url: str, dialect: str, postgres_schemas: PostgresSchemas) -> str:
    """*db_url* at head, built from the chain without running it once per test
    (copy_head_sqlite and replay_head_ddl below)."""
    if dialect == "postgresql":
        replay_head_ddl(postgres_schemas.schema_of(db_url))
    elif dialect == "mysql":
        replay_mysql_head_ddl(db_url)
    else:
        copy_head_sqlite(Path(db_url))
    return db_url


# ------------------------------------------------------------ databases at head ---
# Running the Alembic chain for each of the suite's thousands of tests was most of
# its time. The functional suite takes its database at head from the chain's own
# output instead: on SQLite a byte copy of a file the chain brought to head (once
# per worker), on PostgreSQL the chain's DDL as `alembic upgrade head --sql`
# prints it, replayed in the test's schema in one round trip. test_migrations.py
# holds both equal to a database the chain migrated online; the migration,
# adoption, CLI and deploy tests run the chain itself.


@cache
def _sqlite_head_bytes() -> bytes:
    directory = Path(tempfile.mkdtemp(prefix="relay-head-"))
    path = directory / "head.db"
    upgrade(str(path))
    with sqlite3.connect(path) as connection:  # everything in the main file
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()
    data = path.read_bytes()
    shutil.rmtree(directory)
    return data


def copy_head_sqlite(path: Path) -> None:
    """A SQLite file at head at *path* (created 0600, as the library creates its files)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(_sqlite_head_bytes())


@cache
def postgresql_head_ddl() -> str:
    """The chain's PostgreSQL DDL up to head, as ``alembic upgrade head --sql`` prints it."""
    config = migration_config(DEFAULT_POSTGRES_URL)
    config.output_buffer = io.StringIO()
    alembic_command.upgrade(config, "head", sql=True)
    return config.output_buffer.getvalue()


def replay_head_ddl(schema: str) -> None:
    """Bring the empty *schema* of the test database to head with postgresql_head_ddl()."""
    engine = sa.create_engine(
        postgres_database_url(), isolation_level="AUTOCOMMIT", poolclass=NullPool
    )
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql(f'SET search_path TO "{schema}"')
            # One round trip. The chain builds its indexes CONCURRENTLY (live
            # tables); that cannot run in a multi-statement string, and it waits
            # for every older snapshot in the database -- other tests' too. The
            # schema is new and the test's own: a plain build makes the same
            # catalog (test_the_suites_head_databases_equal_the_chain_run_online).
            script = postgresql_head_ddl().replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX")
            connection.exec_driver_sql(script)
    finally:
        engine.dispose()


@cache
def mysql_head_ddl() -> tuple[str, ...]:
    """The chain's MySQL DDL up to head, statement by statement (PyMySQL runs one
    statement per call), as ``alembic upgrade head --sql`` prints it."""
    config = migration_config(DEFAULT_MYSQL_URL)
    config.output_buffer = io.StringIO()
    alembic_command.upgrade(config, "head", sql=True)
    lines = config.output_buffer.getvalue().splitlines()
    script = "\n".join(line for line in lines if not line.startswith("--"))
    return tuple(part.strip() for part in script.split(";\n") if part.strip())


def replay_mysql_head_ddl(url: str) -> None:
    """Bring the empty MySQL database at *url* to head with mysql_head_ddl()."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            for statement in mysql_head_ddl():
                connection.exec_driver_sql(statement)
            connection.commit()
    finally:
        engine.dispose()


# ----------------------------------------------------------- the deployer ---
# What a deployer has: the installed package and the README's two-line alembic.ini.
TWO_LINE_INI = "[alembic]\nscript_location = relay_flow_projection:migrations\n"
ALEMBIC = Path(sys.executable).parent / "alembic"


@pytest.fixture
def deployer(tmp_path: Path) -> Path:
    """A directory holding only the two-line alembic.ini."""
    directory = tmp_path / "deploy"
    directory.mkdir()
    (directory / "alembic.ini").write_text(TWO_LINE_INI)
    return directory


def deployed_alembic(url: str, cwd: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """``alembic -x url=<url> <arguments>`` as the deployer runs it in *cwd*."""
    return subprocess.run(
        [str(ALEMBIC), "-x", f"url={url}", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def archived(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a retention archive (gzip when its name ends in ``.gz``)."""
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def set_versions(target: str, *versions: str) -> None:
    """Replace the rows of *target*'s version table (a newer release's revision,
    another chain's row beside ours, ...), through a plain SQLAlchemy engine."""
    url = resolve_target(target).url.render_as_string(hide_password=False)
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("DELETE FROM alembic_version")
            for version in versions:
                connection.execute(
                    sa.text("INSERT INTO alembic_version VALUES (:v)"), {"v": version}
                )
    finally:
        engine.dispose()


@pytest.fixture
def engine(migrated_url: str) -> Iterator[Engine]:
    engine = create_engine(migrated_url)
    yield engine
    engine.dispose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# The facades the functional suite runs on: every test using `projection` runs on
# each (RELAY_FLOW_TEST_FACADES=sync narrows it). "async" is aiosqlite on SQLite and
# psycopg's asyncio mode on PostgreSQL; "asyncpg" runs on PostgreSQL only.
FACADES = tuple(os.environ.get("RELAY_FLOW_TEST_FACADES", "sync,async,asyncpg").split(","))


@pytest.fixture(params=FACADES)
def facade(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# Why the conftest deselected what it did (reason: count), for the terminal summary.
DESELECTED_BY_CONFTEST: dict[str, int] = {}
POSTGRESQL_ONLY = "PostgreSQL-only combinations (facade asyncpg, route pgbouncer) on sqlite/mysql"
ROUTE_LEFT_OUT = "routes RELAY_FLOW_TEST_ROUTES leaves out"


def matrix_text() -> str:
    """The matrix the functional suite runs on, and the variables that narrow it."""
    return (
        f"relay-flow test matrix: dialects {','.join(DIALECTS)}; "
        f"facades {','.join(FACADES)} (RELAY_FLOW_TEST_FACADES); "
        f"routes {','.join(ROUTES)} (RELAY_FLOW_TEST_ROUTES); "
        "asyncpg and pgbouncer cases run on PostgreSQL only (the others are deselected); "
        "narrow with -k sqlite, -n0 for one process (README, Running one part quickly)"
    )


def pytest_report_header(config: pytest.Config) -> str:
    return matrix_text()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """asyncpg and PgBouncer are PostgreSQL's: drop their other combinations, not skip them.

    Also drops the routes RELAY_FLOW_TEST_ROUTES leaves out, where a test names its own.
    How many went for which reason is printed at the end (pytest_terminal_summary).
    """
    keep, drop = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        chosen = params.params if params is not None else {}
        postgresql_only = chosen.get("facade") == "asyncpg" or chosen.get("route") == "pgbouncer"
        left_out = "route" in chosen and chosen["route"] not in ROUTES
        if left_out:
            reason = ROUTE_LEFT_OUT
        elif postgresql_only and chosen.get("dialect", "postgresql") != "postgresql":
            reason = POSTGRESQL_ONLY
        else:
            keep.append(item)
            continue
        drop.append(item)
        DESELECTED_BY_CONFTEST[reason] = DESELECTED_BY_CONFTEST.get(reason, 0) + 1
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say why tests were deselected: a bare "560 deselected" explains nothing."""
    deselected = len(terminalreporter.stats.get("deselected", []))
    if not deselected and not DESELECTED_BY_CONFTEST:
        return
    terminalreporter.section("deselected")
    for reason, count in DESELECTED_BY_CONFTEST.items():
        terminalreporter.write_line(f"{count} deselected: {reason}")
    rest = deselected - sum(DESELECTED_BY_CONFTEST.values())
    if rest > 0:
        terminalreporter.write_line(f"{rest} deselected: by -k/-m")
    terminalreporter.write_line(matrix_text())


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.stop()


def async_target(url: str, facade: str) -> tuple[str, dict[str, Any]]:
    """The target and engine arguments of the async facade on the database at *url*."""
    if facade != "asyncpg":
        return url, {}
    parsed = make_url(url).set(drivername="postgresql+asyncpg")
    # asyncpg takes server settings as a dict, not libpq's `options` string.
    options = parsed.query.get("options")
    parsed = parsed.difference_update_query(["options"])
    settings = {}
    if isinstance(options, str) and options.startswith("-csearch_path="):
        settings["search_path"] = options.removeprefix("-csearch_path=")
    connect_args = {"server_settings": settings} if settings else {}
    return parsed.render_as_string(hide_password=False), {"connect_args": connect_args}


@pytest.fixture
def projection(
    engine: Engine,
    clock: FakeClock,
    facade: str,
    migrated_url: str,
    request: pytest.FixtureRequest,
) -> Iterator[RunProjection]:
    """The facade under test on the migrated database (see FACADES)."""
    if facade == "sync":
        yield RunProjection(engine, clock=clock)
        return
    loop: LoopThread = request.getfixturevalue("loop_thread")
    target, kwargs = async_target(migrated_url, facade)
    async_engine = create_async_engine(target, **kwargs)
    adapter = BlockingAsyncProjection(AsyncRunProjection(async_engine, clock=clock), loop, engine)
    # Duck-typed: every RunProjection method, awaited on the loop thread.
    yield cast(RunProjection, adapter)
    loop.call(async_engine.dispose())


@pytest.fixture
def observed_engine(projection: RunProjection) -> Engine:
    """The engine whose events see the statements of `projection` (on either facade)."""
    return cast(Engine, getattr(projection, "observed_engine", projection.engine))


def text_of(value: object) -> object:
    """A raw column value; MySQL's identifiers (VARBINARY) as the text they hold."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


@pytest.fixture
def table_rows(engine: Engine) -> Callable[[str], list[tuple[object, ...]]]:
    """Raw rows of one table, ordered, for asserting 'nothing changed'."""

    def read(table: str) -> list[tuple[object, ...]]:
        # Every column as the database stores it (no type processing), in key order;
        # the key's columns come from the models (reflecting per call was slow).
        key = ", ".join(column.name for column in schema_metadata.tables[table].primary_key)
        with engine.connect() as connection:
            rows = connection.exec_driver_sql(f"SELECT * FROM {table} ORDER BY {key}")
            # MySQL's identifiers are VARBINARY: compare them as the text they hold.
            return [tuple(text_of(value) for value in row) for row in rows]

    return read


@pytest.fixture(params=DIALECTS)
def alembic_engine(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    postgres_schemas: PostgresSchemas,
    mysql_databases: MySQLDatabases,
) -> Iterator[Engine]:
    """pytest-alembic's engine on every database (SQLite: foreign keys off, as for migrations)."""
    if request.param == "postgresql":
        target = postgres_schemas.new_url()
    elif request.param == "mysql":
        target = mysql_databases.new_url()
    else:
        target = str(tmp_path / "a.db")
    engine = build_engine(resolve_target(target), foreign_keys=False, poolclass=NullPool)
    yield engine
    engine.dispose()


@pytest.fixture
def alembic_config() -> AlembicConfig:
    """pytest-alembic runs the packaged chain, as upgrade() does."""
    return migration_config()


def load_benchmark_module(name: str) -> ModuleType:
    """benchmarks/<name>.py loaded by path (the benchmarks are not an installed package)."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"relay_bench_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
