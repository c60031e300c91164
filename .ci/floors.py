"""Check .ci/floors.txt against pyproject.toml, and optionally the running venv against both.

Every runtime requirement of pyproject.toml (dependencies and the extras other
than the test and dev tools) that declares a floor (``>=``) must be pinned at
exactly that version in floors.txt; with ``--installed``, every pin must be
the version installed in the interpreter running this script. Exits 1 with
one line per disagreement.

    python .ci/floors.py [--installed]
"""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
TOOL_EXTRAS = ("test", "dev")  # tools run at current versions, not floors


def declared_floors() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra, requirements in project.get("optional-dependencies", {}).items():
        if extra not in TOOL_EXTRAS:
            lines.extend(requirements)
    floors: dict[str, str] = {}
    for line in lines:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        for specifier in requirement.specifier:
            if specifier.operator != ">=":
                continue
            if floors.setdefault(name, specifier.version) != specifier.version:
                raise SystemExit(f"pyproject.toml: two floors for {name}")
    floors.pop(canonicalize_name(project["name"]), None)
    return floors


def pins() -> dict[str, str]:
    pinned: dict[str, str] = {}
    for raw in (ROOT / ".ci" / "floors.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, separator, version = line.partition("==")
        if not separator:
            raise SystemExit(f"floors.txt: not a name==version pin: {raw!r}")
        pinned[canonicalize_name(name.strip())] = version.strip()
    return pinned


def main() -> int:
    floors, pinned = declared_floors(), pins()
    problems = [
        f"pyproject.toml declares {name}>={floor}, floors.txt pins {pinned.get(name, 'nothing')}"
        for name, floor in sorted(floors.items())
        if name not in pinned or Version(pinned[name]) != Version(floor)
    ]
    if "--installed" in sys.argv[1:]:
        for name, version in sorted(pinned.items()):
            try:
                installed = metadata.version(name)
            except metadata.PackageNotFoundError:
                installed = "nothing"
            if installed == "nothing" or Version(installed) != Version(version):
                problems.append(f"floors.txt pins {name}=={version}, {installed} is installed")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
