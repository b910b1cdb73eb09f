"""Keys naming another project, in the embedded engine.

The engine keeps one project's data, but a GQL text may name another
(``KEY(PROJECT('other'), D, 1)``), and Datastore answers such a text without
reaching the other project. Measured on the Firestore emulator in Datastore
mode (the oracle, issue 25):

* a ``__key__`` filter on it (``=``, ``!=``, ranges, IN, NOT IN, HAS
  ANCESTOR, in any OR branch) is refused: "The request was for database
  'projects/P/...' but was attempting to access database 'projects/other/...'";
* as a property filter's value it is a key ordered by project first: it
  equals no key of the engine's project, and sorts before all of them when
  its project sorts before the engine's (``a > KEY(PROJECT('aaa'), D, 1)``
  finds every key-valued ``a`` and no other type), after all of them
  otherwise;
* a key of the engine's own project named explicitly, or ``PROJECT('')``,
  is an ordinary key;
* an entity whose key names another project is refused ("mismatched
  databases within request"); a key value of another project is stored by
  the emulator, but the engine refuses it (docs/gql.md, its one stated
  limitation: its stored format and index have no project); a key of its
  own project, named, is written, read, allocated and reserved as an
  ordinary key.

So the query is resolved once, before its scan is made: own keys lose their
project, keys of other projects become ``OtherProjectKey`` (which the
value encoding places), and ``__key__`` filters on them are refused.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any, Iterator

from gds_counter.errors import BadKeyError
from gds_counter.gateway.embedded._encoding import OtherProjectKey
from gds_counter.gateway.keys import Key, local_project, plain_key, project_name
from gds_counter.gateway.mutations import Mutation, map_keys
from gds_counter.gateway.query import KEY_PROPERTY, CompositeFilter, Filter, PropertyFilter, Query, leaves_of
from gds_counter.gateway.values import RawEntity


class Projects:
    """The projects of one embedded gateway: ``home``, the project its keys
    belong to (``project``, else ``keys.local_project``), and the project
    the calls in this context come from (``own``). ``gds-counter serve``
    keeps one store for every project, so a key of "another project" is
    another than the request's, which only the request knows: the server
    sets it around each request (``acting_for``), in a context variable of
    this gateway's (per thread and per asyncio task, as the calls reach the
    gateway through its ordinary methods)."""

    def __init__(self, project: str | None) -> None:
        self.home = project_name(project) or local_project()
        self._request: ContextVar[str | None] = ContextVar("gds_counter_request_project", default=None)

    def own(self) -> str:
        return self._request.get() or self.home

    @contextlib.contextmanager
    def acting_for(self, project: str) -> Iterator[None]:
        token = self._request.set(project)
        try:
            yield
        finally:
            self._request.reset(token)


def _names_project(value: Any) -> bool:
    if isinstance(value, tuple):
        return any(isinstance(item, Key) and item.project is not None for item in value)
    return isinstance(value, Key) and value.project is not None


def resolved(query: Query, project: str) -> Query:
    """``query`` with its filter's keys placed against ``project``, or
    ``BadKeyError`` for a ``__key__`` filter on another project's key (before
    anything is read). The same query when no key names a project: the
    common case costs one look at each leaf."""
    if query.filter is None or not any(_names_project(leaf.value) for leaf in leaves_of(query.filter)):
        return query
    return query.replace(filter=_resolved_filter(query.filter, project))


def _resolved_filter(f: Filter, project: str) -> Filter:
    if isinstance(f, CompositeFilter):
        return CompositeFilter(f.op, tuple(_resolved_filter(child, project) for child in f.filters))
    if not _names_project(f.value):
        return f
    if isinstance(f.value, tuple):
        return PropertyFilter(f.name, f.op, tuple(_placed(item, f, project) for item in f.value))
    return PropertyFilter(f.name, f.op, _placed(f.value, f, project))


def _placed(value: Any, leaf: PropertyFilter, project: str) -> Any:
    if not isinstance(value, Key) or value.project is None:
        return value
    if value.project == project:
        return plain_key(value, project)
    if leaf.name == KEY_PROPERTY:
        what = "HAS ANCESTOR" if leaf.op == "HAS_ANCESTOR" else f"a __key__ {leaf.op} filter"
        raise BadKeyError(
            f"{what} on {value} reaches into project {value.project!r}; this database is project {project!r} "
            "(Datastore refuses a query of another project's keys)"
        )
    return OtherProjectKey(value.path, value.namespace, project=value.project, after=value.project > project)


def check_home(keys: list[Key], project: str, what: str) -> None:
    """Refuse a key of another project than ``project``, naming it (the
    emulator: "mismatched databases within request"): the engine's stored
    keys have no project, so it would otherwise read or write its own. A
    key naming ``project`` itself reaches the engine as an ordinary key
    (the gateway's rules drop it first, ``keys.plain_key``)."""
    for key in keys:
        _check_home(key, project, what)


def _check_home(key: Key, project: str, what: str) -> Key:
    if key.project is not None and key.project != project:
        raise BadKeyError(f"cannot {what} {key}: it names project {key.project!r}, and this database is project {project!r}")
    return key


def check_home_mutations(mutations: list[Mutation], project: str) -> None:
    """Refuse, before anything is written, a mutation whose key, or any key
    value it writes (in lists and embedded entities too), names another
    project than ``project``. The emulator stores a key value of another
    project; the engine cannot (docs/gql.md, its one limitation), and
    refuses an entity key of another project as the emulator does."""

    def check(key: Key, holder: RawEntity | None, name: str | None) -> Key:
        if holder is None or key.project is None or key.project == project:
            return _check_home(key, project, "write")
        raise BadKeyError(
            f"property {name!r} of {holder.key} holds {key}, a key naming project {key.project!r}: the embedded "
            f"engine (project {project!r}) stores key values of its own project only (docs/gql.md)"
        )

    map_keys(mutations, check)
