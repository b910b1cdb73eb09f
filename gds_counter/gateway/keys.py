"""Datastore keys: an immutable path of (kind, id or name) steps in a namespace,
and the rules Datastore applies to kinds, names and ids.

Every gateway and the mapper check keys here, so a bad key fails the same way
(and before anything is written) whichever storage is behind it.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable

import attrs

from gds_counter._checks import INT64_MAX, INT64_MIN, check_text, is_int, utf8_size
from gds_counter.errors import BadKeyError, BadValueError

__all__ = [
    "LOCAL_PROJECT", "MAX_DOCUMENT_NAME_BYTES", "MAX_KEY_NAME_BYTES", "MAX_KEY_PATH", "METADATA_KINDS",
    "RESERVED_NAME", "Key", "PathElement", "document_key", "document_path", "key_of_document", "local_project", "plain_key",
]

#: Datastore's limit on a key name (and kind), in UTF-8 bytes.
MAX_KEY_NAME_BYTES = 1500
#: Datastore's longest key path ("Key path is too long. Cannot exceed 100 elements.").
MAX_KEY_PATH = 100

#: Names of the form ``__x__`` belong to Datastore.
RESERVED_NAME = re.compile(r"^__.+__$", re.DOTALL)  # (the emulator takes "____": nothing between)

#: The kinds of Datastore's metadata entities (namespaces, kinds, properties):
#: reserved, but a key may name one, to query them or to bound such a query.
#: They are never written (``values.validate_entity``).
METADATA_KINDS = frozenset({"__namespace__", "__kind__", "__property__"})

#: What a namespace may be (the Firestore emulator refuses anything else:
#: 'Illegal string "a/b" in namespace id'); ``RESERVED_NAME`` ones are Datastore's.
_NAMESPACE = re.compile(r"[0-9A-Za-z._-]{0,100}")

#: What a key's project may be, as the Firestore emulator in Datastore mode
#: takes it in a GQL ``KEY(PROJECT(...), ...)`` and in a key value (measured:
#: ``other-project``, ``1abc``, ``a-``, ``example.com:p``, ``:b``, ``a.com:``
#: and ``__x__`` are taken; ``A``, ``a_b``, ``a.b``, ``-a``, ``a:b:c``,
#: ``__a_b__`` and 101 characters are refused: '"a_b" is an invalid project id.').
_PROJECT = re.compile(r"(?:(?:[a-z0-9][a-z0-9.-]*)?:)?(?:[a-z0-9][a-z0-9-]*)?|__(?:[a-z0-9][a-z0-9-]*)?__")
MAX_PROJECT = 100



def check_kind(kind: str) -> None:
    if not isinstance(kind, str) or not kind:
        raise BadKeyError(f"kind must be a non-empty string, got {kind!r}")
    if RESERVED_NAME.match(kind) and kind not in METADATA_KINDS:
        raise BadKeyError(f"kind {kind!r} is reserved (names of the form __x__ belong to Datastore)")
    if utf8_size(kind, "kind", BadKeyError) > MAX_KEY_NAME_BYTES:
        raise BadKeyError(f"kind {kind[:40]!r}... is over {MAX_KEY_NAME_BYTES} bytes")


def check_key_name(name: Any) -> None:
    """Reject key names Datastore would reject, naming the bad value."""
    if not isinstance(name, str):
        raise BadKeyError(f"key name must be a string, got {type(name).__name__} {name!r}")
    if name == "":
        raise BadKeyError("key name must not be empty ('')")
    if RESERVED_NAME.match(name):
        raise BadKeyError(f"key name {name!r} is reserved (names of the form __x__ belong to Datastore)")
    size = utf8_size(name, "key name", BadKeyError)
    if size > MAX_KEY_NAME_BYTES:
        raise BadKeyError(
            f"key name {name[:40]!r}... is {size} bytes, over the {MAX_KEY_NAME_BYTES}-byte limit"
        )


def check_key_id(key_id: Any) -> None:
    if not is_int(key_id):
        raise BadKeyError(f"key id must be an int, got {type(key_id).__name__} {key_id!r}")
    if not INT64_MIN <= key_id <= INT64_MAX or key_id == 0:
        # Negative ids are stored by the Firestore emulator (and the API
        # reference only discourages them); zero is refused.
        raise BadKeyError(f"key id {key_id!r} is out of range (a 64-bit integer other than 0)")


def namespace_name(namespace: str | None) -> str:
    """``""`` is the default namespace; None means it too. Anything else
    must be a string that is valid Unicode (every key and query takes its
    namespace through here, so the rule is written once)."""
    if not namespace:
        return ""
    if not isinstance(namespace, str):
        raise BadKeyError(f"namespace must be a string, got {type(namespace).__name__} {namespace!r}")
    check_text(namespace, "namespace", BadKeyError)
    if not _NAMESPACE.fullmatch(namespace):
        raise BadKeyError(
            f"namespace {namespace!r} is not allowed: Datastore takes up to 100 of the characters A-Z, a-z, 0-9, "
            "'.', '-' and '_'"
        )
    if RESERVED_NAME.match(namespace):
        raise BadKeyError(f"namespace {namespace!r} is reserved (names of the form __x__ belong to Datastore)")
    return namespace


def project_name(project: str | None) -> str | None:
    """A key's project: None (or ``""``, as Datastore reads an empty
    project id) is the gateway's; anything else must be a project id
    Datastore takes, or ``BadKeyError`` names it."""
    if project is None or project == "":
        return None
    if not isinstance(project, str):
        raise BadKeyError(f"a key's project must be a string, got {type(project).__name__} {project!r}")
    if len(project) > MAX_PROJECT or not _PROJECT.fullmatch(project):
        raise BadKeyError(f"{project[:120]!r} is not a project id Datastore takes (as in my-project or example.com:my-project)")
    return project


#: The project of local storage (the embedded engine, the Datastore
#: emulator) when ``DATASTORE_PROJECT_ID`` names none.
LOCAL_PROJECT = "gds-counter-local"


def local_project() -> str:
    """The project local storage belongs to: ``DATASTORE_PROJECT_ID`` (as
    the emulators' environment names it), else ``LOCAL_PROJECT``; the same
    for the embedded engine and the emulator, so a GQL ``KEY(PROJECT(...))``
    means one thing on both. ``BadValueError`` names a bad one."""
    value = os.environ.get("DATASTORE_PROJECT_ID")
    if not value:
        return LOCAL_PROJECT
    try:
        project = project_name(value)
    except BadKeyError as exc:
        raise BadValueError(f"the environment variable DATASTORE_PROJECT_ID is not a project id: {exc}") from None
    assert project is not None
    return project


@attrs.frozen(cache_hash=True)
class PathElement:
    """One (kind, id or name) step of a key path. Both id and name are None
    only in the last element of an incomplete key, whose id the server allocates."""

    kind: str
    id: int | None = None
    name: str | None = None

    def __attrs_post_init__(self) -> None:
        check_kind(self.kind)
        if self.id is not None and self.name is not None:
            raise BadKeyError(f"key element {self.kind!r} has both id {self.id!r} and name {self.name!r}")
        if self.id is not None:
            check_key_id(self.id)
        if self.name is not None:
            check_key_name(self.name)

    @property
    def id_or_name(self) -> int | str | None:
        return self.id if self.id is not None else self.name


def _path(elements: Iterable[PathElement]) -> tuple[PathElement, ...]:
    path = tuple(elements) if not isinstance(elements, str) else (elements,)
    for element in path:
        if not isinstance(element, PathElement):
            raise BadKeyError(
                f"Key(path, namespace) takes PathElements, got {element!r}; for kinds and ids or names "
                "write Key.of('Kind', 'name'), as keys print in messages"
            )
    return path


@attrs.frozen(cache_hash=True)
class Key:
    """An immutable, hashable Datastore key: a path of (kind, id|name) steps
    plus a namespace (``""`` is the default namespace).

    The project and database are a property of the gateway, not of the key, so
    keys compare equal across gateways and the conformance suite can check
    them exactly: ``project`` is None for every key a gateway reads or makes.
    Only a key that names another project has one: a GQL
    ``KEY(PROJECT('other'), ...)``, or a key value of another project read
    from Datastore. Each gateway decides what it means against its own
    project (``project_name``): the Datastore gateway sends it, the embedded
    engine orders it before or after all of its own keys and refuses to
    filter ``__key__`` on it or to store it.
    """

    path: tuple[PathElement, ...] = attrs.field(converter=_path)
    namespace: str = attrs.field(default="", converter=namespace_name)
    project: str | None = attrs.field(default=None, converter=project_name, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if not self.path:
            raise BadKeyError("a key needs at least one path element")
        if len(self.path) > MAX_KEY_PATH:
            raise BadKeyError(
                f"key path of {len(self.path)} elements (from {self.path[0].kind!r}) is too long: "
                f"Datastore takes at most {MAX_KEY_PATH}"
            )
        for element in self.path[:-1]:
            if element.id_or_name is None:
                raise BadKeyError(f"ancestor {element.kind!r} in a key path must have an id or a name")

    @classmethod
    def of(cls, *flat: Any, namespace: str | None = "", project: str | None = None) -> "Key":
        """``Key.of("Parent", "p1", "Child", 7)``; an odd-length path ends with
        an incomplete element (``Key.of("Book")``). ``project`` only for a key
        naming another project than the gateway's (see the class)."""
        if not flat:
            raise BadKeyError("Key.of() needs at least a kind")
        elements = []
        items = list(flat)
        if len(items) % 2:
            items.append(None)
        for kind, ident in zip(items[0::2], items[1::2]):
            if ident is None:
                elements.append(PathElement(kind))
            elif isinstance(ident, str):
                elements.append(PathElement(kind, name=ident))
            else:
                elements.append(PathElement(kind, id=ident))
        return cls(tuple(elements), namespace or "", project=project)

    @property
    def kind(self) -> str:
        return self.path[-1].kind

    @property
    def id(self) -> int | None:
        return self.path[-1].id

    @property
    def name(self) -> str | None:
        return self.path[-1].name

    @property
    def id_or_name(self) -> int | str | None:
        return self.path[-1].id_or_name

    @property
    def is_partial(self) -> bool:
        return self.path[-1].id_or_name is None

    @property
    def parent(self) -> "Key | None":
        return Key(self.path[:-1], self.namespace, project=self.project) if len(self.path) > 1 else None

    @property
    def flat_path(self) -> tuple[Any, ...]:
        out: list[Any] = []
        for element in self.path:
            out.append(element.kind)
            if element.id_or_name is not None:
                out.append(element.id_or_name)
        return tuple(out)

    def child(self, kind: str, id_or_name: int | str | None = None) -> "Key":
        return Key.of(*self.flat_path, kind, id_or_name, namespace=self.namespace, project=self.project)

    def completed(self, id_or_name: int | str) -> "Key":
        """The same key with the last element's allocated id or name filled in."""
        if not self.is_partial:
            raise BadKeyError(f"key {self} is already complete")
        return Key.of(*self.flat_path, id_or_name, namespace=self.namespace, project=self.project)

    def is_ancestor_of(self, other: "Key") -> bool:
        """True for ``other`` itself and its descendants, as HAS ANCESTOR matches."""
        return (self.project, self.namespace) == (other.project, other.namespace) and other.path[: len(self.path)] == self.path

    def __str__(self) -> str:
        inner = ", ".join(repr(p) for p in self.flat_path)
        ns = f", namespace={self.namespace!r}" if self.namespace else ""
        project = f", project={self.project!r}" if self.project is not None else ""
        return f"Key({inner}{ns}{project})"


def plain_key(key: Key, project: str | None) -> Key:
    """``key`` without its project when that is ``project`` (the gateway's
    own): the same entity as the key that names no project, and equal to
    it, so that the checks on keys named twice see one key."""
    return Key(key.path, key.namespace) if key.project is not None and key.project == project else key


def require_complete(key: Any, what: str) -> Key:
    """``key``, which ``what`` needs to be a complete ``Key``."""
    if not isinstance(key, Key):
        raise BadKeyError(f"{what} needs Key objects, got {type(key).__name__} {key!r}")
    if key.is_partial:
        raise BadKeyError(f"{what} needs complete keys; {key} has no id or name")
    return key


# --- Firestore (native mode) documents ---------------------------------------
#
# A document path is a key path written out: ``counters/likes/shards/3`` is
# ``Key.of("counters", "likes", "shards", "3")`` (a collection id is a kind,
# a document id a key name), the mapping Firestore itself uses between its
# two modes. A numeric id, which native mode does not have, is written
# ``__id7__``, as Firestore writes a Datastore-mode id in a document name.

#: Firestore's limit on a document's name (its path within the database), in bytes.
MAX_DOCUMENT_NAME_BYTES = 6 * 1024

_NUMERIC_ID = re.compile(r"__id(-?[0-9]+)__")


def document_key(path: Any, what: str = "document path") -> Key:
    """The key of the document at ``path`` (``"counters/likes"``), checked
    as Firestore checks a document path a client writes: an even number of
    segments (a document, not a collection), no empty segment, no id of
    more than 1,500 bytes, none that is ``.`` or ``..`` or reserved
    (``__x__``), at most 100 documents deep. ``BadKeyError`` naming the path
    and the segment otherwise, before anything is sent or written."""
    if not isinstance(path, str):
        raise BadKeyError(f"{what} must be a string such as 'counters/likes', got {type(path).__name__} {path!r}")
    size = utf8_size(path, what, BadKeyError)
    if size > MAX_DOCUMENT_NAME_BYTES:
        raise BadKeyError(f"{what} {path[:40]!r}... is {size:,} bytes; Firestore takes at most {MAX_DOCUMENT_NAME_BYTES:,}")
    segments = path.split("/")
    if "" in segments:
        raise BadKeyError(
            f"{what} {path!r} has an empty segment (a leading, trailing or doubled '/'); "
            "write it as collection/document[/collection/document...]"
        )
    if len(segments) % 2:
        raise BadKeyError(
            f"{what} {path!r} names a collection ({len(segments)} segments), not a document: "
            "a document path has an even number of segments, such as 'counters/likes'"
        )
    for segment in segments:
        if segment in (".", ".."):
            raise BadKeyError(f"{what} {path!r}: the id {segment!r} is not allowed in Firestore")
        if RESERVED_NAME.match(segment):
            raise BadKeyError(f"{what} {path!r}: the id {segment!r} is reserved (ids of the form __x__ belong to Firestore)")
        if len(segment.encode("utf-8")) > MAX_KEY_NAME_BYTES:
            raise BadKeyError(f"{what} {path[:40]!r}...: the id {segment[:40]!r}... is over {MAX_KEY_NAME_BYTES} bytes")
    return Key.of(*segments)


def document_path(key: Key) -> str:
    """The document path of ``key`` (``document_key`` read back; a numeric
    id as ``__id7__``). ``BadKeyError`` for a key Firestore's native mode
    cannot hold: an incomplete one, or one in a namespace."""
    if key.namespace:
        raise BadKeyError(f"{key} is in namespace {key.namespace!r}; Firestore in native mode has no namespaces")
    if key.is_partial:
        raise BadKeyError(f"{key} has no id or name, so it names no document")
    for element in key.path:  # (a "/" would make more segments: another document)
        for what, text in (("collection id (kind)", element.kind), ("document id (key name)", element.name)):
            if text is not None and ("/" in text or text in (".", "..")):
                raise BadKeyError(f"{key}: the {what} {text!r} cannot name a Firestore document ('/', '.' and '..' are not allowed)")
    return "/".join(
        f"{element.kind}/{element.name if element.name is not None else f'__id{element.id}__'}" for element in key.path
    )


def key_of_document(path: str) -> Key:
    """The key of a document name Firestore gave back (its path within the
    database): ``document_path`` reversed, ``__id7__`` read as id 7. No
    checks beyond the key's own: the server made the name."""
    segments = path.split("/")
    flat: list[Any] = []
    for kind, ident in zip(segments[0::2], segments[1::2]):
        numeric = _NUMERIC_ID.fullmatch(ident)
        flat += [kind, int(numeric.group(1)) if numeric else ident]
    return Key.of(*flat)
