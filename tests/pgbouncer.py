"""A private PgBouncer in transaction pooling mode, in front of the test server.

Started once per test session on a free loopback port (never the machine's
shared configuration) and stopped at the end. Each test gets a database
alias of its own: the alias points at the test database and its
``connect_query`` sets the search_path to the test's schema. That is how a
schema is chosen behind PgBouncer 1.18, which refuses libpq's ``options``
startup parameter and does not track ``search_path`` in transaction mode.

PgBouncer refuses to run as root, so as root it runs as the ``postgres``
user, with its files in a directory that user can read.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from pg_cluster import free_port

# Small pools on purpose: each server connection serves many clients in turn,
# which is exactly what makes prepared-statement names collide.
SETTINGS = """\
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir}/userlist.txt
admin_users = {user}
pool_mode = transaction
default_pool_size = 4
max_client_conn = 500
max_user_connections = 40
server_idle_timeout = 2
query_wait_timeout = 60
ignore_startup_parameters = extra_float_digits
logfile = {workdir}/pgbouncer.log
pidfile = {workdir}/pgbouncer.pid
"""


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (path for path in ("/usr/sbin/pgbouncer",) if os.access(path, os.X_OK)), None
    )


@dataclass
class PgBouncer:
    """One pgbouncer process; ``alias()`` adds a database entry and reloads."""

    server_host: str
    server_port: int
    user: str
    database: str
    port: int = field(default_factory=free_port)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pgbouncer-")))
    aliases: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    _admin: psycopg.Connection[tuple[object, ...]] | None = None

    def start(self) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise RuntimeError("pgbouncer is not installed (Debian: apt-get install -y pgbouncer)")
        (self.workdir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        self._write_config()
        command = [binary, str(self.workdir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chmod(self.workdir, 0o755)
            for path in [self.workdir, *self.workdir.iterdir()]:
                os.chown(path, account.pw_uid, account.pw_gid)
            command = ["runuser", "-u", "postgres", "--", *command]
        # Its log goes to logfile; stderr to a file too: a pipe nobody drains
        # would fill up and stall the whole pooler.
        with open(self.workdir / "stderr.log", "wb") as stderr:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self._log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen on {self.port}: {self._log_tail()}")

    def alias(self, name: str, search_path: str) -> str:
        """A database alias for *search_path* in the test database; its URL."""
        self.aliases[name] = (
            f"host={self.server_host} port={self.server_port} dbname={self.database} "
            f"connect_query='SET search_path = {search_path}'"
        )
        self._write_config()
        self.admin("RELOAD")
        return self.url(name)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def admin(self, command: str) -> str:
        """A command on PgBouncer's admin console; its rows as ``psql -At`` prints them.

        One connection for the session: a ``psql`` process per command cost more
        than the rest of a test's set-up. The console speaks only the simple query
        protocol, which psycopg's ``ClientCursor`` uses for a query without parameters.
        """
        if self._admin is None or self._admin.closed:
            self._admin = psycopg.connect(
                host="127.0.0.1", port=self.port, user=self.user, dbname="pgbouncer",
                autocommit=True, connect_timeout=30,
            )  # fmt: skip
        try:
            with psycopg.ClientCursor(self._admin) as cursor:
                cursor.execute(command)
                rows = cursor.fetchall() if cursor.description else []
        except psycopg.Error as exc:
            raise RuntimeError(f"pgbouncer {command}: {exc}") from exc
        return "".join(
            "|".join("" if value is None else str(value) for value in row) + "\n" for row in rows
        )

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _write_config(self) -> None:
        lines = ["[databases]"] + [f"{name} = {spec}" for name, spec in self.aliases.items()]
        settings = SETTINGS.format(port=self.port, workdir=self.workdir, user=self.user)
        config = self.workdir / "pgbouncer.ini"
        # Written beside and renamed, so a reload never reads half a file.
        partial = config.with_suffix(".tmp")
        partial.write_text("\n".join(lines) + "\n\n" + settings)
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(partial, account.pw_uid, account.pw_gid)
        partial.replace(config)

    def _log_tail(self) -> str:
        logs = [self.workdir / "pgbouncer.log", self.workdir / "stderr.log"]
        return "".join(log.read_text(errors="replace") for log in logs if log.exists())[-2000:]
