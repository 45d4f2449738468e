"""Python's cyclic garbage collector, set for a proxy (called once a serving process has started).

A request builds tens of thousands of short-lived containers (a 200 KB body parses into ~40,000
dicts, lists and strings) and holds them until its answer is relayed. With Python's default
threshold (700 allocations) the collector runs every few hundred of them and, every hundredth
run, walks every object alive: the bodies of every request in flight, the config, the catalogs,
the tokenizer. So:

- what start-up built (config, the tokenizer's tables, compiled patterns, the app) is frozen
  (`gc.freeze`): the collector never walks it again;
- the youngest generation is collected once `THRESHOLD[0]` more objects are alive than were,
  not 700: a body's objects are mostly freed by reference counting before it runs at all. Cycles still get
  collected; a proxy's memory is bounded by its requests in flight, not by the collector.

`KEEL_GC=default` leaves Python's own setting (to compare, or if an embedding needs it).
bench/gc_posture.py measures the effect.
"""

from __future__ import annotations

import gc
import logging
import os

log = logging.getLogger("keel.gc")
THRESHOLD = (10_000, 10, 10)


def settle() -> None:
    """Collect what start-up left, freeze the rest, and set the threshold (once per process)."""
    if os.environ.get("KEEL_GC", "") == "default":
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLD)
    log.info("gc_settled", extra={"frozen": gc.get_freeze_count(), "threshold": list(THRESHOLD)})
