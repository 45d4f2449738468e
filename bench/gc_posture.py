"""What Python's cyclic garbage collector costs a proxy, and what Keel's setting (`proxy/gcposture.py`)
saves: parsing a body while many parsed bodies are alive (as under concurrency), per setting.

    python bench/gc_posture.py [--alive 64] [--count 200]

Each setting runs in the same process, one after the other, on the same bodies (the 200-tool
chat body of bench/overhead.py, parsed by `jsontext.loads` as Keel's ingress does): the time per
parse (the fastest of five passes; each setting's best of three rounds, taken in turn), the
collections each generation ran, and the ratio to Python's defaults measured in this run.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from overhead import bodies, table

from proxy import gcposture, jsontext

DEFAULTS = gc.get_threshold()


def measure(raw: bytes, alive: int, count: int, threshold: tuple[int, int, int], freeze: bool) -> tuple[float, list[int]]:
    gc.unfreeze()
    gc.collect()
    gc.set_threshold(*threshold)
    started_with = [s["collections"] for s in gc.get_stats()]
    if freeze:
        gc.freeze()  # what start-up built (here: the bench's modules), not the bodies in flight
    held = [jsontext.loads(raw) for _ in range(alive)]  # bodies of requests in flight
    passes = []
    for _ in range(5):
        start = time.perf_counter()
        for i in range(count):
            held[i % alive] = jsontext.loads(raw)  # one request ends, another is parsed
        passes.append((time.perf_counter() - start) / count)
    runs = [s["collections"] - b for s, b in zip(gc.get_stats(), started_with, strict=True)]
    del held
    gc.unfreeze()
    gc.set_threshold(*DEFAULTS)
    return min(passes), runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--alive", type=int, default=64, help="parsed bodies alive at once (requests in flight)")
    parser.add_argument("--count", type=int, default=200, help="parses per pass")
    args = parser.parse_args()
    raw = bodies()["200 tools"]
    settings = [("Python's defaults", DEFAULTS, False), ("defaults, start-up frozen", DEFAULTS, True),
                ("frozen, (10000, 10, 10)", (10_000, 10, 10), True),
                ("Keel's setting", gcposture.THRESHOLD, True), ("collector off", (0, 0, 0), False)]
    best: dict[str, tuple[float, list[int]]] = {}
    for _ in range(3):  # in turn, so a busy spell of the machine falls on every setting alike
        for name, threshold, freeze in settings:
            per, runs = measure(raw, args.alive, args.count, threshold, freeze)
            if name not in best or per < best[name][0]:
                best[name] = (per, runs)
    base = best[settings[0][0]][0]
    rows = [[name, str(threshold), f"{best[name][0] * 1000:.2f}", f"{best[name][0] / base:.2f}",
             " / ".join(map(str, best[name][1]))] for name, threshold, _ in settings]
    print(f"jsontext.loads of a {len(raw) / 1024:.0f} KB body while {args.alive} parsed bodies are alive")
    table(["setting", "threshold", "ms per parse", "x defaults", "collections gen0/1/2"], rows)


if __name__ == "__main__":
    main()
