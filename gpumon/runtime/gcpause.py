"""The cyclic garbage collector held off while a large API answer is decoded and converted.

``json.loads`` builds dicts and lists only, without cycles, and the informer turns them into
frozen views: all of it is freed by reference counting, none of it needs the cyclic collector.
Yet every 700 allocations start a young collection, and the decoded page, alive while it is
converted, is promoted until full collections come: 200 pages of 500 kwok pods (a 10,000-node
fleet's Pods) took 16.7 s of CPU with the collector on, of which 91 full collections up to
0.45 s each, and 9.2 s with it held off (docs/benchmarks.md). A full collection also holds the
event loop, and with it the lease renewal, for its whole length.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection inside the block (synchronous code only: an ``await`` inside would
    hold it off for every other task too); nested blocks leave it to the outermost."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
