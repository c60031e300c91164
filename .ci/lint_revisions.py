"""Lint the chain's revisions for live tables: ``python .ci/lint_revisions.py [--versions DIR]``.

Each revision after the Go generations (0001-0003 re-create the Go releases'
schema) is rendered the way a DBA would apply it, ``alembic upgrade
<previous>:<revision> --sql`` for PostgreSQL (no database is reached), one file
per revision, and linted with squawk under .squawk.toml. Exits non-zero on
any finding, after saying how to fix or justify it.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from relay_flow_projection.migrate import alembic_config

ROOT = Path(__file__).resolve().parents[1]
LAST_GO_GENERATION = "0003_generation_3"
URL = "postgresql+psycopg://lint@127.0.0.1:1/lint"  # rendered offline: never connected


def _config(versions: Path | None) -> Config:
    config = alembic_config(URL)
    if versions is not None:
        config.set_main_option("path_separator", "os")
        config.set_main_option("version_locations", str(versions))
    return config


def linted_revisions(versions: Path | None) -> list[tuple[str, str]]:
    """(previous, revision) for every revision after the Go generations, in order."""
    script = ScriptDirectory.from_config(_config(versions))
    ordered = list(reversed(list(script.walk_revisions())))
    names = [revision.revision for revision in ordered]
    later = ordered[names.index(LAST_GO_GENERATION) + 1 :]
    return [(str(revision.down_revision), revision.revision) for revision in later]


def render(versions: Path | None, previous: str, revision: str) -> str:
    config = _config(versions)
    config.output_buffer = io.StringIO()
    command.upgrade(config, f"{previous}:{revision}", sql=True)
    return config.output_buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".ci/lint_revisions.py", description=__doc__)
    parser.add_argument("--versions", type=Path, help="a versions directory (default: the chain's)")
    arguments = parser.parse_args(argv)
    squawk = shutil.which("squawk", path=str(Path(sys.executable).parent)) or shutil.which("squawk")
    if squawk is None:
        print("squawk is not installed: pip install squawk-cli (the [test] extra has it)")
        return 2
    with tempfile.TemporaryDirectory(prefix="relay-lint-") as directory:
        files = []
        for previous, revision in linted_revisions(arguments.versions):
            path = Path(directory) / f"{revision}.sql"
            path.write_text(render(arguments.versions, previous, revision), encoding="utf-8")
            files.append(str(path))
        linted = subprocess.run(
            [squawk, "--config", str(ROOT / ".squawk.toml"), "--reporter", "gcc", *files],
            capture_output=True,
            text=True,
            check=False,
        )
    findings = (linted.stdout + linted.stderr).strip()
    if linted.returncode != 0:
        print(findings)
        print(
            "\nA revision would block a live table (README, Writing a revision): rewrite it, "
            "or justify the statement with frozen_v2.lint_exemption(rule, why)."
        )
        return linted.returncode
    print(f"squawk: {len(files)} revisions after {LAST_GO_GENERATION}, no findings")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
