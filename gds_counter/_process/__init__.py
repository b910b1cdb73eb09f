"""What the process does to a call from outside it: interrupts, forks and
deadlines. One home, because each is a promise about every module that
blocks or hands work between threads, not about any one of them.

* ``interrupts``: a Ctrl-C, or an exception sent to a thread, may land
  between any two lines. The steps that hand work back to *other* callers
  (returning a pooled connection, answering the seats of a round, releasing
  the process's write lock) run to their end anyway (``surely``), so no
  other caller waits for ever.
* ``forks``: a forked child owns only the thread that forked. Every object
  that holds locks, connections or threads registers its fork hooks in the
  one registry; ``forks.owned_here`` is the one check of "was this made by
  the process I am in".
* ``deadlines``: the running call's deadline, so that waits the caller
  cannot see (a write lock, a group commit, a round) end with the call.

What is promised:

* An interrupt never leaves another caller waiting past its own deadline,
  never leaves a lock held, a connection lent, or a round unanswered.
* An interrupted call is counted at most once, and the caller learns
  nothing false: the interrupt propagates (``KeyboardInterrupt`` is not a
  ``GDSError``); it does not say whether the increment was stored.
* A forked child starts with no lock, connection or thread of its parent's,
  and can count at once; the parent keeps counting.
* No call outlives its deadline by more than one storage round trip.

What is not promised:

* The interrupted call's own outcome: it may or may not have been stored
  (like a killed process). Only ``CommitUnknown`` tells a caller that, and
  only for an error, not an interrupt.
* Interrupts inside C code (sqlite3, grpc) land when that code returns.
* ``fork()`` while another thread is inside sqlite3 or grpc's C code is as
  safe as those libraries make it: the embedded engine closes its pool
  around a fork; grpc's channels are the client's own business.
* Threads killed outright (``os._exit``, SIGKILL) are a crash: the storage's
  own durability holds; nothing in this process is left to wait on.

The cost, and the tests that hold each promise, are written down in
docs/architecture.md ("Process machinery: interrupts, forks, deadlines").
"""
