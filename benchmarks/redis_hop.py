"""What the shared cache's main-thread hop costs per Redis call.

    python benchmarks/redis_hop.py redis://127.0.0.1:6379/0 [--calls 2000]

The shared cache never runs redis-py in the main thread (a signal's
interrupt could land inside it): the main thread's calls are made by the
cache's worker thread (``counter/_off_main.py``), other threads call
directly. This times, in microseconds per call (median of 5 runs of
``--calls``), a cached ``get_count()`` on the asyncio face with its event
loop in the main thread (the hop) and in another thread (direct), and the
cache's ``get`` alone from each. Storage is the memory gateway, so the
difference is the hop's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from typing import Callable

from gds_counter import aio
from gds_counter.counter.redis_cache import RedisCountCache
from gds_counter.gateway import open_gateway


def _median_us(step: Callable[[], object], calls: int) -> float:
    runs = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(calls):
            step()
        runs.append((time.perf_counter() - began) / calls * 1e6)
    return statistics.median(runs)


def _aio_reads(url: str, calls: int) -> float:
    async def main() -> float:
        async with aio.open_gateway("memory://") as gateway:
            counter = aio.CounterShardDS("hop", 1, gateway=gateway, cache=url)
            await counter.add(1)
            await counter.get_count()
            runs = []
            for _ in range(5):
                began = time.perf_counter()
                for _ in range(calls):
                    await counter.get_count()
                runs.append((time.perf_counter() - began) / calls * 1e6)
            return statistics.median(runs)

    return asyncio.run(main())


def _in_a_thread(work: Callable[[], float]) -> float:
    found: list[float] = []
    thread = threading.Thread(target=lambda: found.append(work()))
    thread.start()
    thread.join()
    return found[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="a redis:// URL of a Redis to use")
    parser.add_argument("--calls", type=int, default=2000)
    options = parser.parse_args()
    cache = RedisCountCache(options.url, open_gateway("memory://"))

    def gets() -> float:
        return _median_us(lambda: cache.get("hop"), options.calls)

    print(json.dumps({
        "aio get_count, loop in the main thread (hop)": round(_aio_reads(options.url, options.calls), 1),
        "aio get_count, loop in another thread (direct)": round(_in_a_thread(
            lambda: _aio_reads(options.url, options.calls)), 1),
        "cache.get from the main thread (hop)": round(gets(), 1),
        "cache.get from another thread (direct)": round(_in_a_thread(gets), 1),
    }, indent=1))


if __name__ == "__main__":
    main()
