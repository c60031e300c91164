"""The one benchmark command: ``.venv/bin/python benchmarks/run.py [--quick]``.

Prints one markdown table comparing relay_flow_projection with bare SQLAlchemy Core
and the raw drivers on SQLite and PostgreSQL, then the MariaDB section (see
README.md, "Performance"). ``--quick`` (20,000 runs) is what CI runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a script from a clean clone: make the repository root importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.suite import main

    raise SystemExit(main())
