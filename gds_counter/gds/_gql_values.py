"""Values that enter a GQL query: bound Python values and the BLOB and
DATETIME literals, converted to the gateway's neutral types.

Why one place: a value may arrive bound (``@v``) or written (``DATETIME(...)``)
and the resulting filter must be the same either way, so both paths end in
the same types (UTC datetimes, ``bytes``, 64-bit ints). ``Bindings`` also
keeps the record of which bindings the text used: as the Datastore API
says (``GqlQuery``: every named site needs a parameter "but not necessarily
the inverse"; every positional one, "the inverse must also be true"), an
unused named binding is ignored and an unused positional one refused, as
the Firestore emulator does.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
from typing import Any, Mapping, NoReturn, Sequence

from gds_counter._checks import INT64_MAX, INT64_MIN, is_int, lone_surrogate
from gds_counter.errors import GDSError, GQLError
from gds_counter.gateway.keys import Key
from gds_counter.gateway.query import Cursor, GqlSource
from gds_counter.gateway.values import Geopoint
from gds_counter.gds._gql_lexer import DIGITS, Token, column, is_binding_name, is_reserved_binding, shorten

__all__ = ["Bindings", "decode_blob", "describe", "parse_datetime"]

_UTC = _dt.timezone.utc


def describe(value: Any) -> str:
    """Type and (shortened) repr, so "got str '5'" is told from "got int 5"."""
    return f"{type(value).__name__} {shorten(repr(value), 60)}"


def _neutral(value: Any, label: str, *, inner: bool = False) -> Any:
    """Convert a bound value to the gateway's neutral types, once, so that
    the filter and ``Query.gql`` hold the same thing."""
    if value is None or isinstance(value, (bool, Key, Geopoint)):
        return value
    if isinstance(value, Cursor):
        if inner:
            raise GQLError(f"binding {label}: a Cursor cannot be inside a list")
        return value
    if is_int(value):
        if not INT64_MIN <= value <= INT64_MAX:
            raise GQLError(f"binding {label}: integer {value} does not fit in 64 bits")
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        bad = lone_surrogate(value)
        if bad is not None:
            raise GQLError(
                f"binding {label}: string {shorten(repr(value), 60)} is not valid Unicode "
                f"(a lone surrogate {value[bad]!r} at index {bad}; Datastore strings are UTF-8)"
            )
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise GQLError(
                f"binding {label}: naive datetime {value!r} has no timezone; "
                "give it one (e.g. tzinfo=datetime.timezone.utc)"
            )
        try:
            return value.astimezone(_UTC)
        except OverflowError as exc:
            raise GQLError(f"binding {label}: datetime {value!r} is out of range in UTC") from exc
    if isinstance(value, _dt.date):
        raise GQLError(f"binding {label}: {value!r} is a date; Datastore stores datetimes (with a timezone)")
    gds_key = getattr(value, "__gds_key__", None)
    if callable(gds_key):
        try:
            key = gds_key()
        except GDSError as exc:
            raise GQLError(f"binding {label}: {exc}") from exc
        if not isinstance(key, Key):
            raise GQLError(f"binding {label}: __gds_key__() returned {describe(key)}, not a Key")
        return key
    if isinstance(value, (list, tuple)):
        if inner:
            raise GQLError(f"binding {label}: a list may not contain a list")
        return [_neutral(item, label, inner=True) for item in value]
    raise GQLError(f"binding {label}: cannot bind {describe(value)}")


class Bindings:
    """The caller's bindings, converted, with a record of which were used."""

    def __init__(self, bindings: Mapping[Any, Any] | Sequence[Any] | None) -> None:
        self.named: dict[str, Any] = {}
        self.positional: dict[int, Any] = {}
        self.used: set[str | int] = set()
        if bindings is None:
            return
        if isinstance(bindings, Mapping):
            for key, value in bindings.items():
                self._add(key, value)
        elif isinstance(bindings, (str, bytes, bytearray)) or not isinstance(bindings, Sequence):
            raise GQLError(f"bindings must be a mapping or a sequence, not {type(bindings).__name__}")
        else:
            for position, value in enumerate(bindings, 1):
                self._add(position, value)

    def _add(self, key: Any, value: Any) -> None:
        if not (isinstance(key, str) or is_int(key)):
            raise GQLError(f"binding key {key!r} must be a name (str) or a position (int from 1)")
        if is_int(key):
            if key < 1:
                raise GQLError(f"binding position {key} is out of range (positions count from 1)")
            self.positional[key] = _neutral(value, f"@{key}")
            return
        if not is_binding_name(key):
            raise GQLError(f"binding name {key!r} is not a GQL name ([A-Za-z_$][A-Za-z_$0-9]*)")
        if is_reserved_binding(key):
            raise GQLError(f"binding name {key!r} is reserved (__x__)")
        self.named[key] = _neutral(value, f"@{key}")

    def take(self, token: Token) -> Any:
        """The value for the binding ``token`` names, marked as used."""
        key = token.value
        bound = self.positional if isinstance(key, int) else self.named
        if key not in bound:
            raise GQLError(f"no value bound for @{key} at column {column(token.pos)}", token.pos)
        self.used.add(key)
        return bound[key]

    def source(self, text: str) -> GqlSource:
        """``Query.gql`` for ``text``, once parsing has marked what it used;
        refuses unused positional bindings and gaps in the positions (an
        unused named binding is ignored, as Datastore ignores it)."""
        unused = [f"@{k}" for k in sorted(self.positional) if k not in self.used]
        if unused:
            raise GQLError(f"binding {', '.join(unused)} {'is' if len(unused) == 1 else 'are'} never used in the query")
        positions = range(1, max(self.positional, default=0) + 1)
        missing = [f"@{p}" for p in positions if p not in self.positional]
        if missing:
            raise GQLError(f"positional bindings must run from @1 without gaps; {', '.join(missing)} missing")
        return GqlSource(
            text,
            named=tuple(self.named.items()),
            positional=tuple(self.positional[p] for p in positions),
        )


def decode_blob(text: str, token: Token) -> bytes:
    """``BLOB('...')``'s base64, with ``token`` (the string) for the column:
    the URL-safe alphabet without padding, as Datastore reads it (the
    Firestore emulator refuses ``BLOB('YQ==')`` and ``BLOB('+/')``, and
    takes ``BLOB('YQ')`` and ``BLOB('-_')``)."""
    try:
        if "=" in text or "+" in text or "/" in text or len(text) % 4 == 1:
            raise ValueError("Datastore takes URL-safe base64 without padding ('-' and '_', no '=')")
        return base64.b64decode((text + "=" * (-len(text) % 4)).encode("ascii"), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise GQLError(f"BLOB at column {column(token.pos)} is not valid base64: {exc}", token.pos) from exc


def _digits(text: str) -> bool:
    return bool(text) and all(c in DIGITS for c in text)


def parse_datetime(text: str, token: Token) -> _dt.datetime:
    """RFC 3339 with a required zone; read by hand so that the accepted
    forms do not depend on the Python version's ``fromisoformat``."""

    def bad(why: str) -> NoReturn:
        raise GQLError(
            f"DATETIME {shorten(text)!r} at column {column(token.pos)} {why} "
            "(expected YYYY-MM-DDThh:mm:ss[.ffffff] then Z or +hh:mm)",
            token.pos,
        )

    head, rest = text[:19], text[19:]
    if (
        len(head) != 19
        or head[4] != "-"
        or head[7] != "-"
        or head[10] not in "Tt"  # (a space: the emulator says "does not match pattern")
        or head[13] != ":"
        or head[16] != ":"
        or not all(_digits(head[a:b]) for a, b in ((0, 4), (5, 7), (8, 10), (11, 13), (14, 16), (17, 19)))
    ):
        bad("is not a date and time")
    micro = 0
    if rest.startswith("."):
        end = 1
        while end < len(rest) and rest[end] in DIGITS:
            end += 1
        fraction = rest[1:end]
        if not fraction:
            bad("has no digits after '.'")
        if len(fraction) > 6:
            bad("is finer than microseconds, which is all Datastore keeps")
        micro = int(fraction.ljust(6, "0"))
        rest = rest[end:]
    if rest in ("Z", "z"):
        offset = _dt.timedelta(0)
    elif len(rest) == 6 and rest[0] in "+-" and rest[3] == ":" and _digits(rest[1:3]) and _digits(rest[4:6]):
        hours, minutes = int(rest[1:3]), int(rest[4:6])
        offset_minutes = (hours * 60 + minutes) * (-1 if rest[0] == "-" else 1)
        if hours > 23 or minutes > 59 or not -13 * 60 <= offset_minutes <= 14 * 60:
            bad("has a zone offset outside -13:00 to +14:00")  # (the emulator's range)
        if hours == minutes == 0:
            bad("has a zero offset, which Datastore writes as Z")  # (the emulator: "zero offset must be Z")
        offset = _dt.timedelta(hours=hours, minutes=minutes) * (-1 if rest[0] == "-" else 1)
    elif rest == "":
        bad("has no timezone")
    else:
        bad("has a malformed ending")
    try:
        moment = _dt.datetime(
            int(head[0:4]),
            int(head[5:7]),
            int(head[8:10]),
            int(head[11:13]),
            int(head[14:16]),
            int(head[17:19]),
            micro,
            tzinfo=_dt.timezone(offset),
        )
        return moment.astimezone(_UTC)
    except (ValueError, OverflowError) as exc:
        bad(f"is not a valid moment: {exc}")
