"""The embedded SQLite engine: the default storage, with no server and no account.

It exists so that workshops, tests and small apps get Cloud Datastore's
behaviour (value ordering, multi-valued properties, optimistic transactions,
cursors, namespaces) from one local file, and so that code written against it
keeps working when it moves to Datastore.

The engine is split by idea, each module explaining its own part:

* ``_encoding``: Datastore's value ordering as bytes (``sortable``,
  ``key_bytes``), the lossless JSON each entity is stored as, and cursors.
* ``_index_sql``: which keys a query reads through the index table (a
  superset of its matches, in SQL).
* ``_filter_check``: which of them match, with Datastore's filter semantics.
* ``_scans``: the index scan a query amounts to: the order of its matches,
  and the rows each gives.
* ``_storage``: the SQLite tables, and the writes of one commit (masks,
  transforms, index rows, versions, id allocation).
* ``_connections``: the connection pool: opening a file without writing to
  it, lending connections to calls and holding them for transactions,
  SQLite errors as ours, naming the path.
* ``_connection_life``: the pool's base: how a connection ends (rolled
  back, dropped, closed), the file checked before each commit, and no
  connection across ``fork()``.
* ``_engine``: ``EmbeddedGateway`` itself: transactions, and how a commit
  is written (alone, or in the group commit).
* ``_commit_writes``: what a commit writes inside the write transaction
  (the base of ``EmbeddedGateway``).
* ``_query_batches``: a query's batches: each query shape compiled once,
  and one batch's rows read in the query's order between its cursors.
* ``_files``: opening a file, and SQLite's failures as gds_counter errors.
* ``_file_ids``: a file's identity (``file_id``: checked before every
  commit; the shared cache names a SQLite file by it, whatever path
  reaches it), asked without the file's times.
"""

from gds_counter.gateway.embedded._engine import CAPABILITIES, EmbeddedGateway
from gds_counter.gateway.embedded._file_ids import file_id

__all__ = ["CAPABILITIES", "EmbeddedGateway", "file_id"]
