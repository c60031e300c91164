"""No password reaches a message (issue 22, item 9), and one answer for a login that
can never succeed, on every driver.

A password can sit in the URL's ``user:password@`` part or in its query string
(``?password=``, ``sslpassword``, PyMySQL's ``passwd``...). Every message that
shows a URL -- exceptions, every CLI command's stderr, Alembic's ``FAILED:``
line from ``-x url=`` and from $RELAY_FLOW_DATABASE_URL -- masks all of them
(url_secrets.shown_url), and driver text echoing one is scrubbed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import ALEMBIC, deployed_alembic, require_mysql, require_postgres
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from relay_flow_projection import (
    DatabaseUnavailable,
    ProjectionError,
    open_async_projection,
    open_projection,
)
from relay_flow_projection.driver_errors import translate_error
from relay_flow_projection.engine import resolve_target
from relay_flow_projection.url_secrets import is_secret_key, remember_secrets, shown_url

SECRET = "S3cretPW"
UNREACHABLE = f"postgresql+psycopg://postgres@127.0.0.1:1/x?password={SECRET}"
CLI = str(Path(sys.executable).with_name("relay-flow-projection"))


# ------------------------------------------------------------- the helper ---


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            f"postgresql+psycopg://postgres@127.0.0.1:1/x?password={SECRET}",
            "postgresql+psycopg://postgres@127.0.0.1:1/x?password=***",
        ),
        (
            f"postgresql+psycopg://u:{SECRET}@h/db?sslmode=require&sslpassword={SECRET}",
            "postgresql+psycopg://u:***@h/db?sslmode=require&sslpassword=***",
        ),
        (
            f"mysql+pymysql://root@h/db?passwd={SECRET}&charset=utf8mb4",
            "mysql+pymysql://root@h/db?charset=utf8mb4&passwd=***",
        ),
        (
            f"postgresql+asyncpg://u@h/db?sslkey=/k.pem&api_token={SECRET}&connect_timeout=3",
            "postgresql+asyncpg://u@h/db?api_token=***&connect_timeout=3&sslkey=***",
        ),
        (
            f"postgresql+psycopg://u@h/db?password={SECRET}&password=other",
            "postgresql+psycopg://u@h/db?password=***&password=***",
        ),
        ("postgresql+psycopg://u@h/db?options=-csearch_path%3Dx", None),
    ],
)
def test_shown_url_masks_every_secret(url: str, shown: str | None) -> None:
    expected = url if shown is None else shown
    assert shown_url(make_url(url)) == expected
    assert resolve_target(url).describe() == expected
    assert SECRET not in shown_url(url)  # as text too, parsed or not


def test_a_url_sqlalchemy_cannot_parse_is_masked_as_text() -> None:
    text = f"post gres://u:{SECRET}@h/db?client_secret={SECRET}&x=1"
    assert shown_url(text) == "post gres://u:***@h/db?client_secret=***&x=1"


@pytest.mark.parametrize(
    "key", ["password", "PASSWORD", "passwd", "sslpassword", "sslkey", "ssl_key", "auth_token",
            "client_secret", "aws_secret_access_key", "pwd", "passfile", "private_key"],
)  # fmt: skip
def test_secret_looking_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["sslmode", "options", "connect_timeout", "charset", "host"])
def test_ordinary_keys(key: str) -> None:
    assert not is_secret_key(key)


def test_driver_text_echoing_a_secret_is_scrubbed() -> None:
    secret = f"echo-{uuid.uuid4().hex}"
    remember_secrets(f"postgresql+psycopg://u@h/db?password={secret}")
    orig = Exception(f'invalid connection string "host=h password={secret}"')
    error = translate_error(OperationalError("connect", None, orig), "opening it")
    assert secret not in str(error)
    assert "password=***" in str(error)


# ------------------------------------------------------------- everywhere ---


def test_the_library_error_masks_a_query_password() -> None:
    with pytest.raises(DatabaseUnavailable) as raised:
        open_projection(UNREACHABLE, connect_timeout=2)
    assert SECRET not in str(raised.value)
    assert "?password=***" in str(raised.value)


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RELAY_FLOW_DATABASE_URL"}
    return env | extra


COMMANDS = [
    ["status"],
    ["current"],
    ["check"],
    ["upgrade"],
    ["init"],
    ["downgrade", "base", "--yes"],
    ["runs", "list"],
    ["sweep", "--older-than", "1d"],
    ["identity", "show"],
]


@pytest.mark.parametrize("given", ["--db", "environment"])
def test_no_cli_command_prints_a_query_password(tmp_path: Path, given: str) -> None:
    for command in COMMANDS:
        if given == "--db":
            arguments, env = ["--db", UNREACHABLE, *command], _environment()
        else:
            arguments, env = command, _environment(RELAY_FLOW_DATABASE_URL=UNREACHABLE)
        result = subprocess.run(
            [CLI, *arguments], capture_output=True, text=True, env=env, cwd=tmp_path, check=False
        )
        assert result.returncode == 75, (command, result.stderr)  # unreachable: retryable
        assert SECRET not in result.stdout + result.stderr, command
        assert "password=***" in result.stderr, command


def test_alembic_failed_line_masks_a_query_password(deployer: Path) -> None:
    from_x = deployed_alembic(UNREACHABLE, deployer, "upgrade", "head")
    from_environment = subprocess.run(
        [str(ALEMBIC), "upgrade", "head"],
        cwd=deployer,
        capture_output=True,
        text=True,
        env=_environment(RELAY_FLOW_DATABASE_URL=UNREACHABLE),
        timeout=300,
        check=False,
    )
    for result in (from_x, from_environment):
        said = result.stdout + result.stderr  # Alembic prints FAILED: on stdout
        assert result.returncode != 0
        assert "FAILED:" in said
        assert SECRET not in said
        assert "password=***" in said


# ---------------------------------------------- logins that cannot succeed ---


def _postgres_url(database: str | None = None, user: str | None = None) -> sa.URL:
    from conftest import _admin_url

    url = _admin_url()
    if database is not None:
        url = url.set(database=database)
    if user is not None:
        url = url.set(username=user)
    return url.update_query_dict({"password": SECRET})


def _opened(target: str, driver: str) -> BaseException:
    try:
        if driver == "sync":
            open_projection(target).close()
        else:
            asyncio.run(_open_async(target))
    except Exception as exc:
        return exc
    raise AssertionError("opened a database that does not exist")


async def _open_async(target: str) -> None:
    projection = await open_async_projection(target)
    await projection.close()


@pytest.mark.parametrize("driver", ["sync", "async", "asyncpg"])
@pytest.mark.parametrize("missing", ["database", "role"])
def test_a_missing_postgresql_database_or_role_is_one_answer(driver: str, missing: str) -> None:
    require_postgres()
    name = f"relay_nosuch_{uuid.uuid4().hex[:8]}"
    url = _postgres_url(**{"database" if missing == "database" else "user": name})
    if driver == "asyncpg":
        url = url.set(drivername="postgresql+asyncpg")
    error = _opened(url.render_as_string(hide_password=False), driver)
    assert type(error) is ProjectionError, repr(error)  # not DatabaseUnavailable: no retry helps
    message = str(error)
    assert f'{missing} "{name}" does not exist' in message
    assert SECRET not in message


@pytest.mark.parametrize("sqlstate", ["3D000", "28000", "28P01"])
def test_login_sqlstates_are_not_retryable(sqlstate: str) -> None:
    class DriverError(Exception):
        pass

    orig = DriverError("the server's words")
    orig.sqlstate = sqlstate  # type: ignore[attr-defined]
    error = translate_error(OperationalError("connect", None, orig), "opening it")
    assert type(error) is ProjectionError
    assert "the server's words" in str(error)


def test_a_missing_mysql_database_is_one_answer() -> None:
    require_mysql()
    from conftest import _mysql_admin_url

    name = f"relay_nosuch_{uuid.uuid4().hex[:8]}"
    url = _mysql_admin_url().set(database=name)
    error = _opened(url.render_as_string(hide_password=False), "sync")
    assert type(error) is ProjectionError, repr(error)
    assert name in str(error)
