"""Property paths: what a property mask and an increment transform name.

``e.x`` is property ``x`` of the entity value ``e``; a name in backticks is
taken whole (``` `a.b` ``` is one property named ``a.b``). Measured on the
Firestore emulator: a masked write of ``e.x`` sets or removes ``x`` inside
``e`` and keeps its other properties, an increment of ``e.k`` adds to the
nested value, an empty path is refused ("Invalid empty property path
string"), and so is a reserved member (``__key__``). A member that is not a
plain name (``[a-zA-Z_][a-zA-Z_0-9]*``) must be quoted, with escapes inside
(``_ESCAPE``: ```a-b```; ``a`b`` is ```a\\`b```).
The emulator refuses ``a-b`` or ``1x`` bare ("Invalid property path"), as the v1
reference's "that name must be escaped" says. ``quote`` writes a property
name as such a member, for callers that hold names, not paths.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from gds_counter._checks import check_text
from gds_counter.errors import BadValueError
from gds_counter.gateway._meanings import NO_MEANINGS
from gds_counter.gateway.keys import RESERVED_NAME
from gds_counter.gateway.values import MAX_NESTED_ENTITIES, RawEntity

__all__ = ["KEEP", "MISSING", "check_path", "drop", "excluded", "get", "meaning_at", "parse", "put", "quote"]

#: What ``get`` answers for a path that leads nowhere.
MISSING: Any = object()

#: ``put``'s meaning when the value's meaning is left as it is.
KEEP: Any = object()


#: A member that needs no quotes.
_PLAIN = re.compile(r"[a-zA-Z_][a-zA-Z_0-9]*")
#: The escapes a quoted member may hold, as the Firestore emulator reads
#: them (Java's: ``\\b \\t \\n \\f \\r \\" \\' \\\\``, and ``\\```, ``\\uXXXX``,
#: ``\\UXXXXXXXX``, three octal digits up to ``\\377``); any other is refused.
_ESCAPE = re.compile(r"\\(?:([btnfr\"'\\\\`])|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|([0-3][0-7]{2}))")
#: The letters of the control characters' escapes, and those characters.
_CONTROL_LETTERS, _CONTROLS = "btnfr", "\b\t\n\f\r"
_MEMBER = rf"(?:[a-zA-Z_][a-zA-Z_0-9]*|`(?:[^`\\\\]|{_ESCAPE.pattern})+`)"
#: A path Datastore takes: plain or quoted members, joined by dots.
_PATH = re.compile(rf"{_MEMBER}(?:\.{_MEMBER})*")


def _unescape(match: re.Match[str]) -> str:
    simple, four, eight, octal = match.groups()
    if simple is not None:
        at = _CONTROL_LETTERS.find(simple)
        return _CONTROLS[at] if at >= 0 else simple
    return chr(int(four or eight, 16) if octal is None else int(octal, 8))


def parse(path: str) -> list[str]:
    """The members of ``path``: split at dots outside backticks, the
    escapes inside them read (``_ESCAPE``)."""
    if "." not in path and "`" not in path:
        return [path]  # a plain name (a counter's every write: "target", "count")
    members: list[str] = []
    current: list[str] = []
    i, end = 0, len(path)
    while i < end:
        char = path[i]
        if char == "`":
            i += 1
            while i < end and path[i] != "`":
                escape = _ESCAPE.match(path, i) if path[i] == "\\" else None
                current.append(_unescape(escape) if escape else path[i])
                i = escape.end() if escape else i + 1
        elif char == ".":
            members.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    members.append("".join(current))
    return members


def quote(name: str) -> str:
    """The property ``name`` as one path member: as it is when it is a
    plain name, else in backticks, with a backslash put before each
    backslash and backtick in it."""
    if _PLAIN.fullmatch(name):
        return name
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def check_path(path: object, what: str) -> None:
    """A mask's or transform's path, refused before anything is sent."""
    if not isinstance(path, str):
        raise BadValueError(f"{what} must be a string property path, got {path!r}")
    if _PLAIN.fullmatch(path):  # (a counter's every path: one plain member)
        if RESERVED_NAME.match(path):
            raise BadValueError(f"{what} {path!r}: member {path!r} is reserved (names of the form __x__)")
        return
    if not path.isascii():
        check_text(path, what)
    try:
        members = parse(path)
    except ValueError:  # \\U beyond U+10FFFF
        raise BadValueError(f"{what} {path!r}: an escape beyond the last code point") from None
    if len(members) > MAX_NESTED_ENTITIES + 1:  # (the emulator writes them, and then cannot take the entity back)
        raise BadValueError(f"{what} {path[:60]!r}...: At most {MAX_NESTED_ENTITIES} nested entity values are supported "
                            f"(a path of {len(members)} members)")
    for member in members:
        if not member.isascii():
            check_text(member, what)
        if not member:
            raise BadValueError(f"{what} {path!r}: an empty property path member (Datastore refuses it)")
        if RESERVED_NAME.match(member):
            raise BadValueError(f"{what} {path!r}: member {member!r} is reserved (names of the form __x__)")
    if not _PATH.fullmatch(path):
        hint = "" if "`" in path else f"; write {'.'.join(quote(m) for m in members)}"
        raise BadValueError(
            f"{what} {path!r} is not a Datastore property path: each member is a plain name "
            f"([a-zA-Z_][a-zA-Z_0-9]*) or is quoted in backticks, with \\` for a backtick, \\\\ for a "
            f"backslash, and Java's other escapes inside{hint}"
        )


def get(properties: Mapping[str, Any], members: list[str]) -> Any:
    """The value at ``members`` (MISSING where the path leads nowhere)."""
    value = properties.get(members[0], MISSING)
    for member in members[1:]:
        if not isinstance(value, RawEntity):
            return MISSING
        value = value.properties.get(member, MISSING)
    return value


def excluded(entity: RawEntity, members: list[str]) -> bool:
    """Whether the value at ``members`` of ``entity`` is excluded from the indexes."""
    holder: Any = entity
    for member in members[:-1]:
        holder = holder.properties.get(member)
        if not isinstance(holder, RawEntity):
            return False
    return members[-1] in holder.unindexed


def meaning_at(entity: RawEntity, members: list[str]) -> Any:
    """The meaning of the value at ``members`` of ``entity`` (None: none)."""
    holder: Any = entity
    for member in members[:-1]:
        holder = holder.properties.get(member)
        if not isinstance(holder, RawEntity):
            return None
    return holder.meanings.get(members[-1])


def put(properties: dict[str, Any], unindexed: set[str], members: list[str], value: Any, unindex: bool,
        meanings: dict[str, Any] | None = None, meaning: Any = KEEP) -> None:
    """Set the value at ``members`` (in place at the top level; the entity
    values on the way are rebuilt, made where missing or not entities,
    their meanings kept). ``meaning``, unless ``KEEP``, becomes the value's
    meaning (None: none), held in ``meanings`` at the top level."""
    head = members[0]
    if len(members) == 1:
        properties[head] = value
        (unindexed.add if unindex else unindexed.discard)(head)
        if meaning is not KEEP and meanings is not None:
            if meaning is None:
                meanings.pop(head, None)
            else:
                meanings[head] = meaning
        return
    inner = properties.get(head)
    inner_props = dict(inner.properties) if isinstance(inner, RawEntity) else {}
    inner_unindexed = set(inner.unindexed) if isinstance(inner, RawEntity) else set()
    inner_meanings = dict(inner.meanings) if isinstance(inner, RawEntity) else {}
    put(inner_props, inner_unindexed, members[1:], value, unindex, inner_meanings, meaning)
    properties[head] = _rebuilt(inner_props, inner_unindexed, inner_meanings)
    if meanings is not None:
        meanings.pop(head, None)  # (an entity value takes no meaning)


def drop(properties: dict[str, Any], unindexed: set[str], members: list[str], meanings: dict[str, Any] | None = None) -> None:
    """Remove the value at ``members``, if there is one (and its meaning)."""
    head = members[0]
    if len(members) == 1:
        properties.pop(head, None)
        unindexed.discard(head)
        if meanings is not None:
            meanings.pop(head, None)
        return
    inner = properties.get(head)
    if isinstance(inner, RawEntity):
        inner_props, inner_unindexed, inner_meanings = dict(inner.properties), set(inner.unindexed), dict(inner.meanings)
        drop(inner_props, inner_unindexed, members[1:], inner_meanings)
        properties[head] = _rebuilt(inner_props, inner_unindexed, inner_meanings)


def _rebuilt(properties: dict[str, Any], unindexed: set[str], meanings: dict[str, Any]) -> RawEntity:
    """An entity value of ``properties``, with the flags and meanings of the ones it holds."""
    kept = {name: meaning for name, meaning in meanings.items() if name in properties}
    return RawEntity(None, properties, frozenset(unindexed & set(properties)), kept or NO_MEANINGS)
