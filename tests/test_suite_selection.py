"""The suite says why it deselected tests (the matrix and the variables that narrow it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


NARROWING = ("RELAY_FLOW_TEST_FACADES", "RELAY_FLOW_TEST_ROUTES")


def collect(*arguments: str, **env: str) -> str:
    """The collection report of a child pytest: the full matrix unless *env* narrows it
    (a narrowing this run inherited, as .ci/run's floors job sets, is left out)."""
    inherited = {name: value for name, value in os.environ.items() if name not in NARROWING}
    environment = {**inherited, **env}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n0", "--collect-only", "-q",
         *arguments],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_deselected_tests_are_explained() -> None:
    shown = collect("tests/test_bad_input.py")
    assert "deselected: PostgreSQL-only combinations (facade asyncpg, route pgbouncer)" in shown
    assert "RELAY_FLOW_TEST_FACADES" in shown
    assert "RELAY_FLOW_TEST_ROUTES" in shown


def test_narrowing_by_environment_and_k_is_explained() -> None:
    shown = collect(
        "tests/test_bad_input.py", "-k", "sqlite", RELAY_FLOW_TEST_FACADES="sync",
        RELAY_FLOW_TEST_ROUTES="direct",
    )  # fmt: skip
    assert "deselected: by -k/-m" in shown
    assert "facades sync (RELAY_FLOW_TEST_FACADES)" in shown
    assert "routes direct (RELAY_FLOW_TEST_ROUTES)" in shown
