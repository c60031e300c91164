"""Fixtures of the reliability suite (the size knob is documented in reliability_support)."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import SpawnContext

import pytest

from reliability_support import SCALE_VARIABLE, scale


@pytest.fixture(scope="session")
def spawn() -> SpawnContext:
    """Children start fresh interpreters: no inherited engines, locks or threads."""
    return multiprocessing.get_context("spawn")


def pytest_report_header() -> str:
    return f"reliability scale: {SCALE_VARIABLE}={scale():g}"
