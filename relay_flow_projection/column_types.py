"""The two text column types, declared once for every database.

SQLite and PostgreSQL store both as ``TEXT``: it compares exactly (SQLite's
``BINARY`` collation; PostgreSQL's equality is byte equality) and indexes
whole values of any size our limits admit.

MySQL and MariaDB need their own types (``with_variant``):

* **Identifiers** (ids, keys, repo, workflow, state, visits, sessions) are
  ``VARBINARY(512)``. A ``TEXT`` column cannot be a key there, and every
  character collation breaks exactness somewhere: the server default
  ``utf8mb4_general_ci`` folds case (``'a' = 'A'``), ``utf8mb4_bin`` pads
  trailing spaces (``'a' = 'a '``), and the one no-pad binary collation has a
  different name on MariaDB (``utf8mb4_nopad_bin``) and MySQL 8
  (``utf8mb4_0900_bin``). Binary strings compare byte for byte on both,
  whatever the database's default collation, and sort as SQLite does (UTF-8
  byte order). 512 bytes is also the limit validation.py sets every
  identifier argument on every database to: the widest key,
  (run, node, session), is 1,536 bytes, within InnoDB's 3,072. Values are
  bound as text (the connection's utf8mb4, i.e. their UTF-8 bytes) and come
  back as ``bytes``, decoded here.
* **Free text** (``last_error``, terminal ids, the identity marker) is
  ``LONGTEXT``: MySQL's ``TEXT`` holds 64 KiB and refuses more in strict mode.
  Its character set is the table's, ``utf8mb4`` (schema.MYSQL_TABLE_OPTIONS).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import types
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect

# Both names SQLAlchemy gives the MySQL family: "mysql" (also for a MariaDB
# server reached through mysql://) and "mariadb" (mariadb:// URLs).
MYSQL_DIALECTS = ("mysql", "mariadb")
IDENTIFIER_BYTES = 512


class Utf8Binary(types.TypeDecorator[str]):
    """``VARBINARY`` holding UTF-8 text: ``str`` in, ``str`` out."""

    impl = mysql.VARBINARY
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> None:
        # Bound as text: the server stores its utf8mb4 (UTF-8) bytes. Not as
        # bytes: aiomysql cannot send those beside PyMySQL 1.2 (TypeError).
        return None

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        if isinstance(value, bytes | bytearray):
            return value.decode("utf-8")
        return None if value is None else str(value)


def identifier() -> types.TypeEngine[str]:
    """An identifier column: exact comparison and a key on every database."""
    return types.Text().with_variant(Utf8Binary(IDENTIFIER_BYTES), *MYSQL_DIALECTS)


def free_text() -> types.TypeEngine[str]:
    """Text of any length, never compared or indexed."""
    return types.Text().with_variant(mysql.LONGTEXT(), *MYSQL_DIALECTS)
