"""The shared cache's layout in Redis and the scripts that keep it true.

Each counter has five keys (``counter_keys``): its total, an epoch, the
set of writes in flight (each with a lease), a doubt (no total may be
stored while it lasts) and the run id of the server that wrote them. Every
step of the cache is one of the scripts here, run by Redis as one step.

**The race between a commit and a cache update, and how it is closed.**
The dangerous moment is a reader filling the cache: it reads the shards
(total T) and stores T. A write that commits while it reads may or may not
be in T; if the writer then adds its amount to the stored T, the write is
counted twice; if it found no total to add to and the reader stores T
without it, the write is missing. So each counter has, in Redis, an epoch
and a set of writes in flight:

* a writer, before its commit, enters the set (with a lease) and bumps the
  epoch (``BEGIN``); after it, in one script (``END``), leaves the set,
  bumps the epoch and adds its amount to the total if there is one;
* a reader takes a ticket (the epoch, ``TICKET``) only when no write is in
  flight, and stores its total (``STORE``) only if the epoch is unchanged
  when it stores: no write began or ended meanwhile, so every write it
  could have seen was either committed before its read (and ended before
  its ticket) or begins after its store (and will add its amount).

A writer whose lease ran out is pruned by the next script that reads the
set (``PRUNE``): the total is dropped and kept from being filled for
``ttl``. Redis losing its keys, or coming back with old ones, is ``BUMP``'s
part (below).
"""

from __future__ import annotations

import json
from typing import Hashable

# KEYS: total, epoch, pending, doubt, run. ARGV[1]: ttl in ms.
# An epoch Redis lost (a restart, an eviction, its expiry) starts again at
# Redis's clock in microseconds, never at 0: a ticket taken before the loss
# cannot match an epoch counted again after it.
# A counter's keys are stamped with the run id of the server that wrote
# them (``run``), checked first by every script: a server started again
# (from a snapshot, an append-only file, or a replica promoted) has another
# run id, and what it brought back may be older than adds that returned.
# So under another run (or none) the total is no total and the epoch starts
# again; a ticket names its run, so one taken before the restart never
# matches. Keys that came back from another run may also lack the doubt a
# write of unknown outcome left after the snapshot: no total is kept for
# ttl. A server that tells no run id is refused (reads go to storage).
BUMP = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if not run then return redis.error_reply('the server tells no run_id (INFO server)') end
local stamped = redis.call('GET', KEYS[5])
if stamped ~= run then
  redis.call('DEL', KEYS[1], KEYS[2])
  if stamped then redis.call('SET', KEYS[4], '1', 'PX', ARGV[1]) end
  redis.call('SET', KEYS[5], run, 'EX', 86400)
end
local function bump()
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('SET', KEYS[2], now[1] .. string.format('%06d', tonumber(now[2])))
  end
  redis.call('INCR', KEYS[2])
  redis.call('EXPIRE', KEYS[2], 86400)
  redis.call('EXPIRE', KEYS[5], 86400)
end
"""
# Drops the total (and blocks filling it for ttl) when a writer's lease ran out.
PRUNE = BUMP + """
if redis.call('ZCOUNT', KEYS[3], '-inf', ms) > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ms)
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[4], '1', 'PX', ARGV[1])
  bump()
end
"""
GET = PRUNE + "return redis.call('GET', KEYS[1])"
TICKET = PRUNE + """
if redis.call('ZCARD', KEYS[3]) > 0 or redis.call('EXISTS', KEYS[4]) == 1 then return false end
if redis.call('EXISTS', KEYS[2]) == 0 then bump() end
return run .. ':' .. redis.call('GET', KEYS[2])
"""
# ARGV[2]: the ticket, ARGV[3]: the total.
STORE = PRUNE + """
if redis.call('ZCARD', KEYS[3]) > 0 or redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
if run .. ':' .. (redis.call('GET', KEYS[2]) or '') ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[1])
return 1
"""
# ARGV[2]: the writer's token, ARGV[3]: its lease in ms.
BEGIN = BUMP + """
redis.call('ZADD', KEYS[3], ms + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[3]) * 2)
bump()
return 1
"""
# ARGV[2]: the token, ARGV[3]: "stored", "not stored", "dropped" (stored,
# amount unknown), "unknown", or "forget" (a write Redis never heard of,
# stored: drop the total); ARGV[4]: the amount.
END = BUMP + """
local mine = redis.call('ZREM', KEYS[3], ARGV[2])
bump()
if ARGV[3] == 'not stored' then return 1 end
if ARGV[3] == 'forget' then redis.call('DEL', KEYS[1]) return 1 end
if ARGV[3] == 'stored' and mine == 1 then
  if redis.call('EXISTS', KEYS[1]) == 1 and not pcall(redis.call, 'INCRBY', KEYS[1], ARGV[4]) then
    redis.call('DEL', KEYS[1])  -- past 64 bits: no total rather than a wrong one
  end
  return 1
end
redis.call('DEL', KEYS[1])
if ARGV[3] == 'unknown' or mine == 0 then redis.call('SET', KEYS[4], '1', 'PX', ARGV[1]) end
return 1
"""


def counter_keys(prefix: str, key: Hashable) -> list[str]:
    """The five keys of the counter ``key`` (the scripts' ``KEYS``, in
    order), under ``prefix`` (the cache's prefix and the storage's scope)."""
    base = prefix + json.dumps(list(key) if isinstance(key, tuple) else key, ensure_ascii=False)
    return [base + ":total", base + ":epoch", base + ":writing", base + ":doubt", base + ":run"]
