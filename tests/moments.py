"""Times to read at, for the tests of reads at a past ``read_time``: the
moment now (aware, UTC), and a moment strictly between the commit that just
returned and the next one (the clocks of the engine, the server and the
emulator have a microsecond or a millisecond grain: 2 ms either side)."""

from __future__ import annotations

import datetime as dt
import time

__all__ = ["after_commit", "now"]


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def after_commit() -> dt.datetime:
    """A time after the commit that just returned, and before the next one."""
    time.sleep(0.002)
    stamp = now()
    time.sleep(0.002)
    return stamp
