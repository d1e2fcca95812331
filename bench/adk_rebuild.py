"""The ADK read side's in-process work per event, without a daemon: what a
cold ``get_session`` spends besides the read, measured alone (far less noisy
than the side-by-side bench on a shared machine).

For the events ``adk_bench.py`` writes (the same ``make_event``), each stored
as the service stores it: decoding the stored JSON (msgspec), rebuilding the
``Event`` from it (``streamd.adk.convert``) on the Python plans and on the
compiled builder (``streamd._native.ModelPlan``), and the shallow copy a load
hands out of each event (Python and compiled). Each row is the best of
``--runs`` passes over ``--events`` events, in microseconds per event, with
the cyclic collector paused as a load pauses it.

    .venv/bin/python bench/adk_rebuild.py [--events 2000] [--runs 15]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import msgspec
from adk_bench import make_event
from google.adk.events.event import Event

from streamd.adk import codec, convert


def best_us(work: Callable[[], Any], n: int, runs: int) -> float:
    times = []
    for _ in range(runs):
        gc.disable()
        start = time.perf_counter()
        kept = work()
        times.append(time.perf_counter() - start)
        del kept
        gc.enable()
        gc.collect()
    return round(min(times) / n * 1e6, 3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=2000)
    p.add_argument("--runs", type=int, default=15)
    args = p.parse_args(argv)
    n = args.events
    stored = [codec.log_event(make_event(i)).content for i in range(n)]
    decode = msgspec.json.Decoder().decode
    datas = [decode(c) for c in stored]
    plan = convert._plan(Event)

    def python_plans() -> list[Any]:
        out = []
        for data in datas:
            built = plan.build(data)
            out.append(Event.model_validate(data) if built is convert._NO else built)
        return out

    events = python_plans()
    row: dict[str, Any] = {
        "events": n,
        "decode_us": best_us(lambda: [decode(c) for c in stored], n, args.runs),
        "rebuild_python_us": best_us(python_plans, n, args.runs),
        "copy_python_us": best_us(lambda: [convert.copied(e) for e in events], n, args.runs),
    }
    compiled = convert.compiled_plan(Event)
    if compiled is not None:
        row["rebuild_compiled_us"] = best_us(lambda: compiled.build_all(datas), n, args.runs)
        row["copy_compiled_us"] = best_us(lambda: convert.copied_all(events), n, args.runs)
    row["load"] = os.getloadavg()
    for key, value in row.items():
        print(f"{key:22} {value}")
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
