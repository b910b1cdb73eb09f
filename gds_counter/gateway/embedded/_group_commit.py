"""Group commit: one process's concurrent non-transactional commits to a
file, written in one SQLite transaction.

A commit to a file waits for its fsync (``synchronous = FULL``), and this
process's writers take the write lock one at a time. So while one commit
holds the lock, the others queue behind it; the writer that gets the lock
next writes every commit queued by then, each in its own savepoint, in one
transaction with one fsync, and answers each. That is what databases call
group commit. Every commit keeps its meaning:

* **Atomic and isolated on its own**: each runs in a savepoint, in arrival
  order, with its own commit number (entity versions), exactly as if it had
  committed alone at that point of the order. One that raises (a bad value,
  an overflow, the write-rate model's Contention) is rolled back to its
  savepoint and raised to its own caller only.
* **Acknowledged only when durable**: every caller returns after the
  transaction's ``COMMIT`` (and its fsync) returned.
* **An error says whether it was stored.** When the transaction fails
  before ``COMMIT`` began, nothing in it was written and every caller in it
  raises an error that says so. Once ``COMMIT`` began (``Batch.sent``) and
  before it is known to have returned (``Batch.durable``), the commits may
  be stored: each caller in it raises ``CommitUnknown`` (the writer itself
  raises what interrupted it). After ``COMMIT`` returned they are stored,
  and the other callers get their results whatever then happens to the
  writer.
* **A caller that leaves is never written afterwards, nor hangs the file.**
  An interrupt (``KeyboardInterrupt``, an asynchronous exception) or the
  wait's bound can end a caller's wait at any point. While its commit is
  still queued it is taken out of the queue, so no writer writes it later,
  and the interrupt carries a note saying it was not written. Once a writer
  has taken it, it may be written; the note says so. A caller that was to
  write next hands that on; a writer that is interrupted before ``COMMIT``
  began puts the others' commits back in the queue for the next writer (an
  interrupt is not their failure). The hand-over itself is repeated until
  it is complete, so a second interrupt cannot leave anyone waiting.

Transactions (which hold a snapshot and are validated) and in-memory
databases (no fsync to share) commit alone.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from gds_counter._process import forks
from gds_counter._process.interrupts import release_if_held, surely
from gds_counter.errors import CommitUnknown, Contention, GDSError, Unavailable
from gds_counter.gateway.embedded._connections import BUSY_TIMEOUT_S

__all__ = ["Batch", "GroupCommit", "Request"]

# A request's states (see ``Request.state``).
QUEUED = 0  #: in the queue, waiting for a writer to take it
WRITE = 1  #: in the queue, and its caller is the next writer
TAKEN = 2  #: in a writer's batch: it may be written from here on
DONE = 3  #: answered: ``results`` or ``error`` is final
LEFT = 4  #: its caller left before any writer took it: never written

#: How long a queued caller waits, by default, for the writers ahead of it:
#: each waits up to the busy timeout for this process's write lock (a
#: transaction's commit) and again for the file's. (The engine passes less
#: when the caller's deadline comes sooner: ``_process.deadlines``.)
DEFAULT_WAIT_S = 2 * BUSY_TIMEOUT_S + 15


class Request:
    """One caller's commit: its mutations, then its results or error.

    ``woken`` is a lock taken from the start and released when the request
    is done, or when its caller is to write next: the caller waits by
    acquiring it. (A ``threading.Event`` builds a Condition per commit and
    notifies through it, a measurable share of a commit's CPU.) It is
    released at most once per wait (``GroupCommit._wake``). ``state`` says
    where the request is (``QUEUED``, ``WRITE``, ``TAKEN``, ``DONE``,
    ``LEFT``); it changes only under the group's lock, which is what lets a
    caller that leaves know whether its commit may still be written."""

    __slots__ = ("mutations", "state", "results", "error", "woken", "signalled", "stored")

    def __init__(self, mutations: Any) -> None:
        self.mutations = mutations
        self.state = QUEUED
        self.results: Any = None
        self.error: BaseException | None = None
        self.woken = threading.Lock()
        self.woken.acquire()
        self.signalled = False
        #: Once answered or left: whether it was stored (None: unknown).
        self.stored: bool | None = False


class Batch:
    """What a writer hands ``write``: calling it takes every request queued
    by then (once the writer holds the file's lock). ``write`` sets
    ``sent`` just before ``COMMIT`` and ``durable`` once it returned, or
    clears ``sent`` when ``COMMIT`` failed and left the transaction open
    (nothing written); from these the group tells each caller the truth
    when ``write`` raises."""

    __slots__ = ("_group", "requests", "sent", "durable", "finished")

    def __init__(self, group: GroupCommit) -> None:
        self._group = group
        self.requests: list[Request] = []
        self.sent = False
        self.durable = False
        self.finished = False  # answered and handed on (``GroupCommit._finish``)

    def __call__(self) -> list[Request]:
        self.requests = self._group._take()
        return self.requests


class GroupCommit:
    """The commits queued for one file's write lock (see the module
    docstring). Safe across ``fork()``: a child starts with an empty queue.

    One caller at a time is the writer; the others wait on their own lock,
    not on the write lock. A writer that is done wakes the callers it wrote
    and hands the writing to the first caller still queued. (When every
    caller queued on the write lock, the ones already written took it one
    by one just to see that they were done, each behind the next group's
    whole transaction.)"""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = forks.here()
        self._lock = threading.RLock()  # an RLock knows its owner: release_if_held
        self._queue: list[Request] = []
        self._writing = False

    def commit(
        self,
        mutations: Any,
        write_lock: Any,
        write: Callable[[Batch], None],
        failed: Callable[[BaseException], BaseException],
        wait_s: float = DEFAULT_WAIT_S,
    ) -> Any:
        """Queue ``mutations``; unless a writer before has already written
        them, become the writer and, under ``write_lock``, ``write(batch)``:
        ``batch()`` hands it every request queued by then (the writer calls
        it once it holds the file's lock), and it sets each one's results
        once committed, or its own error. When ``write`` raises, this
        caller raises that and every other caller in the batch an error
        that says whether it may be stored: ``failed(that)`` when nothing
        was written. A caller waits at most ``wait_s`` for the writers
        ahead of it (then ``Contention`` if its commit was not taken,
        ``CommitUnknown`` if it was). Returns this one's results or raises
        its error."""
        if not forks.owned_here(self._pid):
            self._reset()
        request = Request(mutations)
        try:
            # Inside the ``try``: an interrupt as the ``with`` exits (a
            # signal's handler runs after the lock's release returns) would
            # otherwise leave this request queued, perhaps as the writer,
            # with nobody to write it or hand the writing on.
            with self._lock:
                self._queue.append(request)
                if not self._writing:
                    self._writing = True
                    request.state = WRITE
            if request.state != WRITE and not request.woken.acquire(timeout=wait_s):
                self._give_up(request, wait_s)
            if request.state == WRITE:
                self._write(request, write_lock, write, failed)
        except BaseException as exc:
            # An interrupt that lands as a ``with self._lock`` is entered can
            # leave the lock held (bpo-29988): ``_leave`` would wait on it for ever.
            release_if_held(self._lock)
            self._leave(request, exc)
            raise
        if request.error is not None:
            raise request.error
        return request.results

    def _take(self) -> list[Request]:
        with self._lock:
            batch, self._queue = self._queue, []
            for request in batch:
                request.state = TAKEN
        return batch

    # -- callers that leave ----------------------------------------------------

    def _give_up(self, request: Request, wait_s: float) -> None:
        """The wait's bound passed: leave, with an error that says whether
        the commit may still be written."""
        with self._lock:
            if request.state in (QUEUED, WRITE):
                self._withdraw(request)
                raise Contention(f"the commit waited {wait_s:g} s for the writers ahead of it in this process; it was NOT written")
            if request.state == TAKEN:
                raise CommitUnknown(f"the commit waited {wait_s:g} s for the transaction writing it, which has not ended; it may or may not be stored")
        # DONE meanwhile: answered after all.

    def _leave(self, request: Request, exc: BaseException) -> None:
        """This caller leaves with ``exc``: a commit not yet taken is taken
        out of the queue (and the writing handed on, if it was this
        caller's turn); an interrupt gets a note saying what was stored."""
        with self._lock:
            if request.state in (QUEUED, WRITE):
                self._withdraw(request)
            state, stored = request.state, request.stored
        if isinstance(exc, GDSError):
            return  # a gds_counter error says it already
        if state == TAKEN or stored is None:
            _note(exc, "gds_counter: this commit may or may not be stored (a writer had taken it when its caller left)")
        elif stored:
            _note(exc, "gds_counter: this commit WAS written (it was durable before the interruption)")
        else:
            _note(exc, "gds_counter: this commit was NOT written")

    def _withdraw(self, request: Request) -> None:
        """Take a commit that no writer took out of the queue for good, and
        hand the writing on if it was this caller's turn (under the lock)."""
        turn = request.state == WRITE
        if request in self._queue:
            self._queue.remove(request)
        request.state, request.stored = LEFT, False
        if turn:
            self._hand_over()

    def _hand_over(self) -> None:
        """Wake the first queued caller to write next, or note that no one
        writes (under the lock)."""
        if not self._queue:
            self._writing = False
        else:
            # Woken whether or not it was marked already: an interrupt as
            # ``_wake`` was entered leaves it marked and asleep, and the
            # hand-over, run again, must still wake it (``_wake`` is once).
            self._queue[0].state = WRITE
            _wake(self._queue[0])

    # -- the writer -----------------------------------------------------------

    def _write(
        self,
        request: Request,
        write_lock: Any,
        write: Callable[[Batch], None],
        failed: Callable[[BaseException], BaseException],
    ) -> None:
        batch = Batch(self)
        failure: BaseException | None = None
        try:
            with write_lock:
                write(batch)
        except BaseException as exc:
            failure = exc
        # However often it is interrupted, the hand-over completes: it is
        # done once (``Batch.finished``), and no one else would ever wake
        # the callers.
        # An interrupt as the ``with`` exits can skip the release (the
        # write lock is an RLock, which knows it is still this thread's).
        pending: BaseException | None = None
        try:
            pending = surely(lambda: release_if_held(write_lock))
        except BaseException as exc:  # noqa: B902  (an interrupt as it returned: finish first, raise it after)
            pending = exc
        while not batch.finished:
            try:
                self._finish(request, batch, failure, failed)
            except BaseException as exc:  # an interrupt: finish first, raise it after
                pending = pending or exc
        if pending is not None:
            raise pending
        if request.error is not None:
            raise request.error
        if failure is not None:
            raise failure  # an interruption after the commit was durable

    def _finish(self, request: Request, batch: Batch, failure: BaseException | None, failed: Callable[[BaseException], BaseException]) -> None:
        """Answer every request the writer took with the truth about it,
        put back the ones an interrupted writer did not write, and hand the
        writing on; once (see ``_write``)."""
        with self._lock:
            if batch.finished:
                return
            interrupted = failure is not None and not isinstance(failure, Exception)
            if failure is not None and not batch.requests and not interrupted:
                # Failed before taking (the file stayed locked): the queued
                # commits would only meet the same; none was written.
                batch.requests = self._queue
                self._queue = []
                for queued in batch.requests:
                    queued.state = TAKEN
            # Whether the batch is stored: True, False, or None (unknown).
            outcome = True if failure is None or batch.durable else (None if batch.sent else False)
            again: list[Request] = []
            for queued in batch.requests:
                if queued.state != TAKEN:
                    continue
                if queued.error is not None:
                    queued.stored = False  # its own error: rolled back to its savepoint
                elif outcome:
                    queued.stored = True
                elif queued is request:
                    queued.stored, queued.error = outcome, failure
                elif outcome is None:
                    assert failure is not None
                    queued.stored = None
                    queued.error = failed(failure) if isinstance(failure, CommitUnknown) else CommitUnknown(
                        f"the commit was written together with others, and that transaction's COMMIT was "
                        f"interrupted ({failure!r}); it may or may not be stored"
                    )
                elif interrupted:
                    queued.results = None
                    again.append(queued)  # the writer's interruption is not its failure: the next writer writes it
                    continue
                else:
                    assert failure is not None
                    queued.stored, queued.error = False, failed(failure)
                queued.state = DONE
            if request.state in (QUEUED, WRITE):  # never taken: its caller leaves
                self._queue.remove(request)
                request.state, request.stored = LEFT, False
            for queued in reversed(again):
                queued.state = QUEUED
                self._queue.insert(0, queued)
            for queued in batch.requests:
                if queued is not request and queued.state == DONE:
                    _wake(queued)
            self._hand_over()
            batch.finished = True


def _wake(request: Request) -> None:
    """Release a waiting caller once, even when repeated after an interrupt
    (a second release of a lock its caller did not take again is refused)."""
    if request.signalled:
        return
    try:
        request.woken.release()
    except RuntimeError:
        pass  # released already, by the interrupted try
    request.signalled = True




def _note(exc: BaseException, text: str) -> None:
    """Add ``text`` to an interrupt's notes (``add_note``, Python 3.11+;
    before, the same ``__notes__`` list, which tracebacks then omit)."""
    notes = getattr(exc, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        try:
            exc.__notes__ = notes  # type: ignore[attr-defined]
        except AttributeError:
            return
    notes.append(text)


def for_another(exc: BaseException) -> BaseException:
    """The error for a caller whose commit was in a group transaction that
    failed with ``exc`` (so nothing of it was written): its own instance,
    of the same type where that type takes a message alone, so that
    ``Contention`` is still retried."""
    if isinstance(exc, Contention):
        return Contention(str(exc), attempts=exc.attempts)
    if isinstance(exc, GDSError):
        try:
            return type(exc)(str(exc))
        except TypeError:
            pass
    # Not applied and safe to retry, as Unavailable says (a GatewayError
    # would leave its caller to read "not written" in the message only).
    return Unavailable(f"the commit was to be written together with others, and that failed before anything was "
                       f"written ({exc!r}), so it was NOT written")
