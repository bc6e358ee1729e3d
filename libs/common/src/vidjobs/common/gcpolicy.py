"""How often the cycle collector may stop a service's event loop, and a metric of how long it does.

CPython 3.11 collects reference cycles with the world stopped, and a collection of the oldest generation walks
every object the process tracks. A gateway holding 10,000 event streams tracks over a million, so each such
collection held its event loop (every request, every stream) for 0.1 to 0.55 s, every second or two while the
streams opened. Its default trigger is the oldest generation having grown by a quarter since the last one,
which a heap growing tenfold meets a dozen times. And they found almost nothing to free (at most a few
hundred objects of the million walked): reference counting frees what the services let go of; cycles are
rare and mostly short-lived, and the young generations, collected as before, find those. The few that live
long wait a little longer for their collection (about a thousand objects at a time, spaced).

So once a service has started (`install`):
- what it built to start (modules, settings, pools, adapters) is frozen: never garbage, never walked again;
- a collection of the oldest generation waits for `FULL_EVERY` collections of the middle one (CPython's
  default is 10), besides CPython's own rule of a quarter's growth: a heap growing tenfold is walked whole a
  few times, not a dozen, and a steady one about as rarely as before;
- every collection's pause is observed (`vidjobs_gc_pause_seconds`, by generation), so an operator sees it.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import Histogram

# Collections of the middle generation between two of the oldest (the third of gc.set_threshold): each middle
# one follows 10 young ones, each young one 700 more objects tracked than freed.
FULL_EVERY = 100

GC_PAUSE_SECONDS = Histogram(
    "vidjobs_gc_pause_seconds", "How long each collection of reference cycles stopped the process, by generation",
    ["generation"], buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))

# Each generation's histogram child, made once (`install`): the callback runs at every collection, hundreds a
# second in a busy process, so it looks nothing up.
_pauses: dict[int, Any] = {}
_started_at = [0.0]


def _observe(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started_at[0] = time.perf_counter()
    else:
        _pauses[info["generation"]].observe(time.perf_counter() - _started_at[0])


def install() -> None:
    """Freeze what the process built to start and space full collections (see the module docstring). Call
    once, when the service is up; a second call only freezes what was built since."""
    gc.collect()  # leave no garbage among what is frozen
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_EVERY)
    if _observe not in gc.callbacks:
        # Exported from the start, at zero.
        _pauses.update({generation: GC_PAUSE_SECONDS.labels(str(generation)) for generation in range(3)})
        gc.callbacks.append(_observe)
