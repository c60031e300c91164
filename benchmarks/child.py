"""Child-process entry: ``python -m benchmarks.child '<json>'`` runs one section, prints JSON.

Each section runs in a process of its own so that peak memory (the child's
own VmHWM) and warm caches do not leak from one into another.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from . import async_sections, round_trips, sections, sweep

SECTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "operations": sections.operations,
    "concurrency": sections.concurrency,
    "listings": sections.listings,
    "sweep_layer": sweep.sweep_layer,
    "sweep_go": sweep.sweep_go,
    "iterate": sections.iterate,
    "async_operations": async_sections.async_operations,
    "async_concurrency": async_sections.async_concurrency,
    "pooler_cost": async_sections.pooler_cost,
    "round_trips": round_trips.round_trips,
}


def main(argv: list[str]) -> None:
    request = json.loads(argv[1])
    target = sections.Target(**request.pop("target"))
    result = SECTIONS[request.pop("section")](target, **request)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(sys.argv)
