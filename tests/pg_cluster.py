"""A throwaway PostgreSQL cluster on a side port, for tests that restart or stop a server.

``initdb`` and ``pg_ctl`` come from ``pg_config --bindir`` (Debian keeps them
off PATH). The cluster lives in a temporary directory, listens on 127.0.0.1
only, trusts local connections and is destroyed at the end: the machine's
shared server is never touched. As root it runs as the ``postgres`` user
(PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


def postgres_bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    result = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
    bindir = Path(result.stdout.strip())
    return bindir if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file() else None


def free_port() -> int:
    """A loopback port nobody listens on right now (for a server of the test's own)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PgCluster:
    bindir: Path
    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pg-cluster-")))

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, driver: str = "psycopg") -> str:
        return f"postgresql+{driver}://postgres@127.0.0.1:{self.port}/postgres"

    def init(self) -> None:
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self._as_postgres(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
            "--auth=trust", "--no-sync", "-E", "UTF8",
        )  # fmt: skip

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories='' "
            "-c fsync=off -c max_connections=40"
        )
        self._pg_ctl("start", "-w", "-t", "60", "-o", options, "-l", str(self.root / "log"))

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("stop", "-w", "-t", "60", "-m", mode)

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("stop", "-w", "-t", "60", "-m", "immediate", check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        self._as_postgres(str(self.bindir / "pg_ctl"), "-D", str(self.data), *args, check=check)

    def _as_postgres(self, *command: str, check: bool = True) -> None:
        argv = ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else [*command]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if check and result.returncode != 0:
            log = self.root / "log"
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise RuntimeError(f"{command[0]} failed: {result.stderr.strip()}\n{tail}")
