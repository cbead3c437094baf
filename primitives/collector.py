"""The garbage collector of a long-running process, set for a server's allocation pattern.

CPython's cyclic collector runs a young-generation pass every 700 net allocations of tracked
objects and, every 100 of those, a full pass over every object the process holds: in a
gateway serving a few hundred messages a second that is one full pass every few seconds over
the interpreter, the libraries and their caches (hundreds of thousands of objects, tens of
milliseconds each, on the event loop: an acknowledgement waits behind it). Measured with
`gc.callbacks` over 400 Slack turns: 573 ms in the collector (228 young, 21 middle, 2 full
passes), 1.4 ms of CPU a message.

`settle_after_start` moves what start-up allocated (modules, config, pools: never garbage)
into the permanent generation, so full passes no longer walk it, and makes young passes rarer:
a turn allocates a few thousand objects, almost all freed by reference counting when it ends.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Net allocations between young-generation passes (CPython's default: 700)."""
MIDDLE_EVERY = 20
OLD_EVERY = 20


def settle_after_start() -> None:
    """Freeze what start-up allocated and space the collector's passes for serving; call
    once the process is ready to serve, after its imports and set-up."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_EVERY, OLD_EVERY)
