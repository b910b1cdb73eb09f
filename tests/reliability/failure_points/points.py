"""Every point where a concurrency mechanism blocks or hands work over.

One table, declarative, so that a reader sees what is covered and a
refactor that moves the code breaks the harness loudly (``tracer.resolve``
raises for a function or line that is gone; a point no scenario reached
fails its mechanism's test). ``faces`` and ``backends`` say which scenarios
reach the point: the thread face (``gds_counter.CounterShardDS``), the
asyncio face (``gds_counter.aio``), in memory or on a SQLite file; and
``layout="documents"`` that its scenarios run Firestore's
``DistributedCounter`` instead.
"""

from __future__ import annotations

from failure_points.tracer import Point

__all__ = ["FAULTS", "FIRESTORE_FAULTS", "MECHANISMS", "POINTS", "points_of"]

CW = "gds_counter.counter._combined"
LO = "gds_counter.counter._lone"
RD = "gds_counter.counter._rounds"
GC = "gds_counter.gateway.embedded._group_commit"
WR = "gds_counter.gateway.embedded._commit_writes"
SR = "gds_counter.counter._shared_reads"
CA = "gds_counter.counter.cache"
EN = "gds_counter.counter._engine"
AF = "gds_counter.counter.shard_choice"
CP = "gds_counter.gateway.embedded._connections"
TH = "gds_counter.aio._threaded"
AG = "gds_counter.aio.counter"
FR = "gds_counter.gateway.firestore._requests"

BOTH = ("threads", "aio")
AIO = ("aio",)
FILE = ("sqlite",)
EMULATOR = ("firestore",)

POINTS: tuple[Point, ...] = (
    # -- the door: a lone call goes straight through, a second one goes into the rounds --
    Point("lone.registers", LO, "Combine.run", r"line:alone = key not in lines\.lines and .*lines\.alone\.setdefault",
          "a write looks at its counter's lines: registers as its lone call, or finds it busy"),
    Point("lone.writes", LO, "Combine.run", r"line:^\s+drive\(self\.write\(self\.amount, 1\)\)",
          "the lone caller writes its own amount straight through"),
    Point("lone.takes_back", LO, "_take_back", "call",
          "a lone call ended: its registration goes (and a line opened meanwhile hears of it)", BOTH),
    Point("lone.ended_in_line", RD, "Lines.alone_ended", "call",
          "a caller that arrived during a lone call opened the line: the lone call's end lets its round start",
          BOTH, crowd=8),
    Point("lone.reads", LO, "SharedRead.run", r"line:result = drive\(self\.read\(\)\)",
          "the lone reader reads its total straight through"),
    Point("lone.async_registers", LO, "Combine.arun", r"line:lines\.alone\[key\] = self",
          "a task registers as its counter's lone write", AIO),
    Point("lone.async_writes", LO, "Combine.arun", r"line:await adrive\(self\.write\(self\.amount, 1\)\)",
          "the lone task writes its own amount straight through", AIO),
    Point("lone.async_reads", LO, "SharedRead.arun", r"line:result = await adrive\(self\.read\(\)\)",
          "the lone task reads its total straight through", AIO),
    # -- combined writes: callers of one counter share the next write ------------------
    Point("combined_writes.join", CW, "CombinedWrites.run", r"line:lines\.join\((key|seat)\)",
          "a caller joins the open round under the lines' lock"),
    Point("combined_writes.follower_waits", CW, "CombinedWrites.run", r"line:^\s+mine\.done\.wait\(\)|ThreadLines\.await_end\(mine, lines, lock, seat\)",
          "a caller whose amount rides in another's write waits for its outcome"),
    Point("combined_writes.follower_woken", CW, "CombinedWrites.run", r"line:if mine\.failed:|return _joined\(mine",
          "the follower was answered and reads the round's outcome"),
    Point("combined_writes.leads", CW, "CombinedWrites.run", r"line:ThreadLines\.lead\(",
          "a leader, before it waits for its turn and starts"),
    Point("combined_writes.writes", CW, "CombinedWrites.run", r"line:^\s+write\(total, len\(shares\)\)",
          "the leader commits the sum for every caller"),
    Point("combined_writes.written", CW, "CombinedWrites.run", r"line:lines\.finish\((key, line, mine|seat), None\)$",
          "the write returned; its callers are not answered yet"),
    Point("combined_writes.async_follower_waits", CW, "AsyncCombinedWrites.run", r"line:await as_async\(mine\.done\)\.wait\(\)|await LoopLines\.await_end\(mine\)",
          "a task whose amount rides in another's write awaits its outcome", AIO, crowd=10),
    Point("combined_writes.async_leads", CW, "AsyncCombinedWrites.run", r"line:await LoopLines\.lead\(",
          "a leading task, before its turn", AIO),
    Point("combined_writes.async_writes", CW, "AsyncCombinedWrites.run", r"line:await write\(total, len\(shares\)\)",
          "the leading task commits the sum", AIO),
    Point("combined_writes.async_written", CW, "AsyncCombinedWrites.run", r"line:lines\.finish\((key, line, mine|seat), None\)$",
          "the task's write returned; its callers are not answered yet", AIO),
    # -- rounds: a leader's way into its round ---------------------------------------
    Point("rounds.turn_wait", RD, "ThreadLines.lead", r"line:mine\.turn\)?\.wait\(",
          "a leader waits for a running round to end", crowd=8),
    Point("rounds.settle", RD, "ThreadLines.lead", r"line:^\s+pause\(\)$",
          "a leader lets ready threads join before it starts"),
    Point("rounds.start", RD, "ThreadLines.lead", r"line:lines\.start\((line|seat)\)",
          "the leader starts: later callers open the next round"),
    Point("rounds.finish", RD, "Lines.finish", "call",
          "a round ended: its callers are answered, the next round may start"),
    # (A task leader waiting for its turn, LoopLines.lead's turn wait, is not
    # listed: with up to 8 tasks on two counters no scenario reached it.)
    Point("rounds.async_settle", RD, "LoopLines.lead", r"line:await asyncio\.sleep\(0\)",
          "a leading task lets ready tasks join", AIO),
    # -- the embedded group commit (files only) ---------------------------------------
    Point("group_commit.queued", GC, "GroupCommit.commit", r"line:self\._queue\.append\(request\)",
          "a commit joins the file's queue", BOTH, FILE, crowd=8),
    Point("group_commit.waits", GC, "GroupCommit.commit", r"line:request\.woken\.acquire\(",
          "a queued commit waits to be written or to write", ('threads',), FILE, crowd=8),
    Point("group_commit.woken", GC, "GroupCommit.commit", r"line:if not request\.done:|if request\.state == WRITE:",
          "a queued commit was woken: written already, or its turn to write", ('threads',), FILE, crowd=8),
    Point("group_commit.write_lock", GC, "GroupCommit._write", r"line:with write_lock:",
          "the writer takes the process's write lock", ('threads',), FILE, crowd=8),
    Point("group_commit.writes", GC, "GroupCommit._write", r"line:^\s+write\((take|batch)\)",
          "the writer writes every queued commit in one transaction", BOTH, FILE, crowd=8),
    Point("group_commit.hands_over", GC, "GroupCommit._write", r"line:self\._queue\[0\]\.woken\.release\(\)|self\._finish\(request, batch",
          "the writer hands the writing to the next queued commit", ('threads',), FILE, crowd=8),
    Point("group_commit.committed", WR, "CommitWrites._write_group", r"line:self\.stats\.bump\(\"grouped_commits\"",
          "the group's COMMIT returned; no caller is answered yet", ('threads',), FILE, crowd=8),
    Point("group_commit.committed_alone", WR, "CommitWrites._write_within", r"line:if self\.path is None:",
          "a commit written alone returned from COMMIT; its caller is not answered yet"),
    # -- shared reads -------------------------------------------------------------------
    Point("shared_reads.follower_waits", SR, "SharedReads.run", r"line:^\s+mine\.done\.wait\(\)|ThreadLines\.await_end\(mine, lines, lock, seat\)",
          "a reader waits for the read it joined", crowd=10),
    Point("shared_reads.leads", SR, "SharedReads.run", r"line:ThreadLines\.lead\(",
          "a reader leads a shared read", crowd=10),
    Point("shared_reads.reads", SR, "SharedReads.run", r"line:result = (_read_settled\()?read(\(\)|\))",
          "the leader reads for every caller", crowd=10),
    Point("shared_reads.answers", SR, "SharedReads.run", r"line:lines\.finish\((key, line, mine|seat), result",
          "the read returned; its callers are not answered yet", crowd=10),
    Point("shared_reads.async_follower_waits", SR, "AsyncSharedReads.run", r"line:await as_async\(mine\.done\)\.wait\(\)|await LoopLines\.await_end\(mine\)",
          "a task waits for the read it joined", AIO, crowd=10),
    Point("shared_reads.async_reads", SR, "AsyncSharedReads.run", r"line:result = await read\(\)",
          "the leading task reads for every caller", AIO, crowd=10),
    # -- the count cache ------------------------------------------------------------------
    Point("cache.write_begins", CA, "CountCache._begin", r"line:state\.writing \+= 1",
          "a write is marked in flight (reads go to storage)", BOTH),
    Point("cache.write_runs", EN, "CounterCore._adding", r"line:^\s+yield from self\._commit\(amount\)$",
          "the commit runs inside the cache's bracket", BOTH),
    Point("cache.write_ends", CA, "CountCache._end", r"line:state\.writing -= 1",
          "the write's outcome adjusts the cached total", BOTH),
    Point("cache.stores", CA, "CountCache.store", "call",
          "a total read from storage is offered to the cache", BOTH),
    # -- shard affinity ----------------------------------------------------------------------
    Point("affinity.takes", AF, "AffinityShards.take", r"line:state\.held\[shard\] = ",
          "a writer takes a shard no other writer of the process holds", BOTH),
    Point("affinity.releases", AF, "AffinityShards.give_back", "call",
          "the writer gives its shard back", BOTH),
    Point("affinity.wrote", AF, "AffinityShards.wrote", "call",
          "a strategy reports what it found and wrote", BOTH),
    Point("affinity.seen", AF, "AffinityShards.seen", "call",
          "a read reports every shard it saw", BOTH),
    # -- the embedded connection pool ----------------------------------------------------------
    Point("pool.acquire", CP, "ConnectionPool._acquire", "call",
          "a call borrows a connection"),
    Point("pool.waits", CP, "ConnectionPool._wait", "call",
          "every connection is lent: the call waits for one (in memory: one connection)", ("threads",), ("memory",)),
    Point("pool.release", CP, "ConnectionPool._release", "call",
          "a call gives its connection back"),
    Point("pool.connects", CP, "ConnectionPool._connect", "call",
          "a new connection is opened outside the pool's lock", ("threads",), FILE),
    # (a fork made by another thread is every point's ``fork`` fault; these are where it meets the pool)
    Point("pool.fork_gate_waits", CP, "ConnectionPool.let_a_fork_pass", r"line:self\._no_fork_pending\.wait\(",
          "a fork is pending: a new call waits outside the pool's lock and the write lock, so that the forking "
          "thread gets them", ("threads",), FILE, forks_beside=True),
    # (and a fork made inside a call, by the thread making it, as a signal's handler would)
    Point("pool.fork_under_lock", CP, "ConnectionPool._acquire", r"line:conn = self\._idle\[-1\]",
          "a call takes an idle connection under the pool's lock: a fork made there leaves the half-changed "
          "state alone (_fork_inside) and refuses the child", ("threads",), FILE, fork_here=True),
    Point("pool.fork_while_opening", CP, "ConnectionPool._acquire", r"line:conn, opened = self\._connect\(create=False\), True",
          "a call opens a connection outside the lock (its thread's opening flag set): a fork made there does "
          "not wait for its own opening", ("threads",), FILE, fork_here=True),
    Point("pool.fork_in_lent_call", CP, "Lease.__enter__", r"line:if not forks\.owned_here\(conn\.pid\)",
          "a call holds its lent connection: a fork made there refuses the child, where the call goes on with "
          "a connection the parent owns (the Lease refuses it)", ("threads",), FILE, fork_here=True),
    Point("pool.fork_in_commit", WR, "CommitWrites._commit_now", r"line:conn\.execute\(self\._pool\.commit_statement\(conn\)\)",
          "a writer's last step: a fork made there must not commit the child's copy of the transaction into "
          "the parent's log", ("threads",), FILE, fork_here=True),
    # -- the asyncio face's executor -------------------------------------------------------------
    Point("aio.submits", TH, "ThreadedGateway._in_pool", r"line:^\s+return await ",
          "a task hands a blocking call to the worker pool and awaits it", AIO),
    Point("aio.in_worker", TH, "ThreadedGateway.commit", "call",
          "a worker thread starts a task's commit", AIO),
    Point("aio.slot", AG, "_run", r"line:await asyncio\.wait_for\(slots\.acquire\(\), waited\)",
          "a task waits for one of the gateway's in-flight slots", AIO),
    # -- Firestore's distributed counter (documents): a process's first write records and creates --
    Point("documents.shares_recording", EN, "CounterCore._ensure_recorded",
          r"line:yield from plan\.ask\(SharedRead\(runtime\.shared, runtime\.async_shared, key, record",
          "callers writing a new counter at once hand its recording to one of them (a shared read)",
          BOTH, layout="documents"),
    Point("documents.records", EN, "CounterCore._record", r"line:decided = yield from retry_plan\(attempt",
          "the recording transaction: num_shards, masked, on the counter document (retried on conflict)",
          BOTH, layout="documents"),
    Point("documents.recorded", EN, "CounterCore._record", r"line:^\s+self\._learn\(decided\)",
          "the recording committed; the process has not learned it yet", BOTH, layout="documents"),
    Point("documents.creates", EN, "CounterCore._create_shards", r"line:yield from plan\.commit\(creations\)",
          "one commit creates every recorded shard document (increments by 0; a failure is logged, not raised)",
          BOTH, layout="documents"),
    Point("documents.created", EN, "CounterCore._create_shards", r"line:self\._created = max\(self\._created, upto\)",
          "the shard documents exist; the process has not noted it yet", BOTH, layout="documents"),
    # -- the Firestore gateway's RPCs, on the native-mode emulator (test_firestore_points; not a
    #    mechanism of the runner's: the faults there are FIRESTORE_FAULTS, each on the faces it applies to) --
    Point("firestore.sends", FR, "_send", r"line:return ask\(Send\(",
          "any RPC, as it is sent (with the client's retries)", BOTH, EMULATOR, layout="documents"),
    Point("firestore.begins", FR, "FirestoreRequests._begin_plan", r"line:answer = yield from _send\(",
          "the recording transaction begins", BOTH, EMULATOR, layout="documents"),
    Point("firestore.reads", FR, "FirestoreRequests._run_query_plan", r"line:answers = yield from _send\(",
          "a read of the total (the ancestor query of the shards)", BOTH, EMULATOR, layout="documents"),
    Point("firestore.commits", FR, "FirestoreRequests._commit_plan", r"line:answer = yield from _send\(",
          "a commit (the recording, the shard creation, an increment), as it is sent", BOTH, EMULATOR,
          layout="documents"),
    Point("firestore.committed", FR, "FirestoreRequests._commit_plan", r"line:upserts = sum\(isinstance\(m, Upsert\)",
          "a commit was applied; its caller is not answered yet", BOTH, EMULATOR, layout="documents"),
)

MECHANISMS: tuple[str, ...] = (
    "lone", "combined_writes", "rounds", "group_commit", "shared_reads", "cache", "affinity", "pool", "aio",
    "documents",
)

#: Every fault the harness injects (``harness.FAULTS`` says what each does).
FAULTS: tuple[str, ...] = ("interrupt", "cancel", "fork", "stall", "crash")

#: The faults injected at the Firestore gateway's points, on the emulator.
FIRESTORE_FAULTS: tuple[str, ...] = ("interrupt", "cancel", "stall")


def points_of(mechanism: str) -> list[Point]:
    found = [point for point in POINTS if point.name.split(".")[0] == mechanism]
    if not found:
        raise LookupError(f"no failure points for mechanism {mechanism!r}")
    return found
