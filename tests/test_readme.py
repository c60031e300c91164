"""The README's example code runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_usage_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    usage = _python_blocks()[0]
    namespace: dict[str, object] = {}
    exec(compile(usage, "README.md", "exec"), namespace)
    assert (tmp_path / "relay-flow.db").exists()
