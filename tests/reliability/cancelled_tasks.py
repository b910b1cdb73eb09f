"""Tasks counting while they are cancelled at random moments: run as a script.

    python cancelled_tasks.py URL ROUNDS TASKS MAX_DELAY_S SEED

Each round starts TASKS tasks that each call ``add(1)`` on one counter of
the asyncio face, waits a random delay of up to MAX_DELAY_S, then cancels
about half of them, wherever they are: waiting for a slot, joining or
leading a combined write, queued for or inside a worker thread. Each
call's deadline is 5 s; if a round has not ended 30 s later, or the whole
run takes 240 s, every thread's stack is printed and the process exits
with status 1. Prints one JSON line: calls that returned (``acked``),
calls cancelled or told the outcome is unknown (``maybe``), cancellations
that took (``cancels``), and the total stored (``stored``), read back at
the end.

(This is how an asyncio program is interrupted: ``asyncio.run`` turns a
Ctrl-C into the main task's cancellation. A ``KeyboardInterrupt`` raised
inside a running event loop can lose a task's wake-up in asyncio itself;
see docs/reliability.md.)
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import random
import sys

from gds_counter import RetryPolicy, aio
from gds_counter.errors import CommitUnknown

ROUND_HANG_S = 30.0


async def count(url: str, rounds: int, tasks: int, max_delay: float, dice: random.Random) -> dict[str, int]:
    counts = {"acked": 0, "maybe": 0, "cancels": 0}
    async with aio.open_gateway(url) as gateway:
        counter = aio.CounterShardDS("cancelled", 2, gateway=gateway, retry=RetryPolicy(deadline=5.0))

        async def add_one() -> None:
            try:
                await counter.add(1)
                counts["acked"] += 1
            except (CommitUnknown, asyncio.CancelledError):
                counts["maybe"] += 1

        for _ in range(rounds):
            running = [asyncio.ensure_future(add_one()) for _ in range(tasks)]
            await asyncio.sleep(dice.random() * max_delay)
            for task in running:
                if dice.random() < 0.5 and task.cancel():
                    counts["cancels"] += 1
            _, pending = await asyncio.wait(running, timeout=ROUND_HANG_S)
            if pending:
                faulthandler.dump_traceback(all_threads=True)
                for task in pending:
                    task.print_stack()
                sys.exit(1)
        counts["stored"] = await counter.get_count()
    return counts


def main() -> None:
    url, rounds, tasks, max_delay, seed = (
        sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    )
    faulthandler.dump_traceback_later(240, exit=True)
    counts = asyncio.run(count(url, rounds, tasks, max_delay, random.Random(seed)))
    faulthandler.cancel_dump_traceback_later()
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
