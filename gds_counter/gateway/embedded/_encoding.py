"""How the embedded engine turns values into bytes and text.

Two encodings, for two jobs:

* ``sortable``/``key_bytes``: an order-preserving byte encoding, so that
  SQLite's plain byte comparison *is* Datastore's value ordering. The index
  table, filters, sort orders and cursors all compare these bytes and nothing
  else.
* ``dump_entity``/``load_entity``: tagged JSON, lossless (ints and floats
  stay apart, bytes, datetimes, keys, geopoints and embedded entities carry a
  tag) and never pickle, so a database file is safe to open and readable by
  hand. An entity's value meanings (``gateway._meanings``), when it has
  any, are one more member ``"m"``; an entity without is stored as before.

Value ordering follows what Datastore documents ("based on the internal
representations") and what both official emulators do (checked by hand):
null < integers and timestamps (one class, timestamps as microseconds since the
epoch, interleaved with integers) < booleans < byte strings and unicode strings
(one class, compared as bytes, strings as UTF-8, interleaved) < doubles
(-inf < ... < -0.0 < 0.0 < ... < +inf < NaN; -0.0 never equals 0.0, NaN
equals NaN, as on the Firestore emulator) < geopoints < keys.

Files written before NaN and -0.0 took these encodings hold their old index
rows (NaN below -inf, -0.0 as 0.0) until the entity is written again; see
the README ("Deliberate differences from Datastore"). Inequality filters span types (``v < "b"`` also matches
integers), and inequalities on one property must be met by one list element.

Every encoding is prefix-free (fixed width, or escaped and terminated), so
inverting the bytes gives exactly the reverse order: that is how descending
sort orders and cursors compare with plain byte comparison.
"""

from __future__ import annotations

import base64
import datetime as _dt
import functools
import json
import math
import struct
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, Callable, Iterable, Iterator

import attrs

from gds_counter.errors import BadKeyError, BadValueError, GatewayError
from gds_counter.gateway._meanings import kept
from gds_counter.gateway.keys import Key, PathElement
from gds_counter.gateway.values import EPOCH, Geopoint, RawEntity, epoch_micros, index_values

# --- order-preserving value encoding ---------------------------------------

_NULL, _INT, _BOOL, _STR, _FLOAT, _GEO, _KEY = (bytes([c]) for c in (0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70))
_INVERT = bytes(range(255, -1, -1))


def escaped(raw: bytes) -> bytes:
    """``raw`` made prefix-free: NULs escaped, then a terminator that sorts
    below any escaped byte, so a shorter string sorts first."""
    return raw.replace(b"\x00", b"\x00\xff") + b"\x00\x01"


def _i64(number: int) -> bytes:
    return (number + 2**63).to_bytes(8, "big")


def _f64(number: float) -> bytes:
    if math.isnan(number):
        return b"\xff" * 8  # above +inf, as Datastore sorts NaN (measured on the Firestore emulator); NaN = NaN
    (bits,) = struct.unpack(">Q", struct.pack(">d", number))  # -0.0 sorts just below 0.0 and never equals it
    bits = bits ^ 0xFFFF_FFFF_FFFF_FFFF if bits >> 63 else bits | 1 << 63
    return bits.to_bytes(8, "big")


@functools.lru_cache(maxsize=16_384)  # keys are immutable; hot keys (counter shards) are encoded on every read
def key_bytes(key: Key) -> bytes:
    """A key's sortable encoding: namespace, then path elements (kind, then
    ids before names, ids numerically, names bytewise). A key's encoding minus
    its last byte is a prefix of every descendant's, which makes HAS_ANCESTOR
    a range scan."""
    out = [escaped(key.namespace.encode())]
    for element in key.path:
        out.append(b"\x02" + escaped(element.kind.encode()))
        if element.id is not None:
            out.append(_id_bytes(element.id))
        elif element.name is not None:
            out.append(b"\x02" + escaped(element.name.encode()))
        else:
            out.append(b"\x00")
    out.append(b"\x01")
    return b"".join(out)


def key_value(encoded: bytes) -> bytes:
    """A key's encoding (``key_bytes``) as an indexed value's (``sortable``)."""
    return _KEY + encoded


def key_place(encoded: bytes) -> tuple[str, str]:
    """The namespace and the kind of the key ``encoded`` (``key_bytes``'s
    inverse, as far as a cursor's check needs it); ``BadValueError`` when
    the bytes are not such an encoding."""
    at = 0

    def text() -> str:  # one ``escaped`` string, from ``at``
        nonlocal at
        end = at
        while encoded[end : end + 2] != b"\x00\x01":
            end += 2 if encoded[end : end + 1] == b"\x00" else 1
            if end >= len(encoded):
                raise BadValueError("cursor's key is damaged")
        raw, at = encoded[at:end].replace(b"\x00\xff", b"\x00"), end + 2
        try:
            return raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise BadValueError("cursor's key is damaged") from None

    namespace, kind = text(), ""
    while encoded[at : at + 1] == b"\x02":  # a path element: its kind, then an id or a name
        at += 1
        kind = text()
        tag, at = encoded[at : at + 1], at + 1
        if tag == b"\x01":
            at += 8 if encoded[at : at + 8] != bytes(8) else 16
        elif tag == b"\x02":
            text()
    return namespace, kind


def _id_bytes(key_id: int) -> bytes:
    """An id's sortable encoding. A positive id is its 8 bytes, as it has
    always been stored; a negative one (which Datastore stores too) is 8
    zero bytes, which no positive id has, then the id offset by 2**63:
    below every positive id, and in numeric order among themselves."""
    if key_id > 0:
        return b"\x01" + key_id.to_bytes(8, "big")
    return b"\x01" + bytes(8) + (key_id + 2**63).to_bytes(8, "big")


def descendant_range(ancestor: Key) -> tuple[bytes, bytes]:
    """[low, high) of the encodings of ``ancestor`` and all its descendants."""
    stem = key_bytes(ancestor)[:-1]
    return stem, stem + b"\x03"


def sortable(value: Any) -> bytes:
    """Encode one indexed value so that bytes order is Datastore's order."""
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return _BOOL + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return _INT + _i64(value)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise BadValueError(f"naive datetime {value!r} cannot be compared; give it a timezone")
        return _INT + _i64(epoch_micros(value))
    if isinstance(value, str):
        return _STR + escaped(value.encode("utf-8"))
    if isinstance(value, bytes):
        return _STR + escaped(value)
    if isinstance(value, float):
        return _FLOAT + _f64(value)
    if isinstance(value, Geopoint):
        return _GEO + _f64(value.latitude) + _f64(value.longitude)
    if isinstance(value, OtherProjectKey):
        return _KEY + (b"\xff" if value.after else b"\x00\x00")
    if isinstance(value, Key):
        if value.project is not None:
            raise BadKeyError(f"{value} names another project than the embedded engine's; it cannot be indexed here")
        return key_value(key_bytes(value))
    raise BadValueError(f"a {type(value).__name__} ({value!r}) cannot be indexed, filtered or sorted on")


@attrs.frozen(cache_hash=True)
class OtherProjectKey(Key):
    """A filter's key of another project than the engine's, as the engine
    compares it (``_projects.resolved``): Datastore orders keys by project
    first, so it sorts before every key the engine holds (``after`` False:
    its project sorts before the engine's) or after every one, never equal
    to one. Its encoding is ``_KEY`` and then ``\\x00\\x00`` (an own key's
    namespace begins ``\\x00\\x01``, ``\\x00\\xff`` or a byte above) or
    ``\\xff`` (no UTF-8 byte), so it is no prefix of a stored key either."""

    after: bool = attrs.field(default=False, kw_only=True)


def descending(encoded: bytes) -> bytes:
    """The encoding that sorts in the reverse order (it is prefix-free)."""
    return encoded.translate(_INVERT)


def index_entries(entity: RawEntity) -> Iterator[tuple[str, bytes, Any]]:
    """(name, encoding, value) of every value a Datastore index holds
    (``values.index_values``)."""
    for name, value in index_values(entity):
        yield name, sortable(value), value


# --- lossless serialisation (tagged JSON) ----------------------------------


def _key_to_json(key: Key) -> list[Any]:
    return [key.namespace, [[e.kind, e.id_or_name] for e in key.path]]


def _key_from_json(data: list[Any]) -> Key:
    namespace, path = data
    return Key(
        tuple(PathElement(kind, name=ident) if isinstance(ident, str) else PathElement(kind, id=ident) for kind, ident in path),
        namespace,
    )


def _to_json(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value  # json keeps int and float apart, and writes inf/nan
    if isinstance(value, bytes):
        return {"b": base64.b64encode(value).decode("ascii")}
    if isinstance(value, _dt.datetime):
        return {"t": epoch_micros(value)}
    if isinstance(value, Key):
        return {"k": _key_to_json(value)}
    if isinstance(value, Geopoint):
        return {"g": [value.latitude, value.longitude]}
    if isinstance(value, RawEntity):
        return {"e": _entity_to_json(value)}
    if isinstance(value, list):
        return [_to_json(item) for item in value]
    raise BadValueError(f"cannot store a {type(value).__name__} ({value!r})")


def _from_json(data: Any) -> Any:
    if isinstance(data, list):
        return [_from_json(item) for item in data]
    if not isinstance(data, dict):
        return data
    ((tag, inner),) = data.items()
    if tag == "b":
        return base64.b64decode(inner)
    if tag == "t":
        return EPOCH + _dt.timedelta(microseconds=inner)
    if tag == "k":
        return _key_from_json(inner)
    if tag == "g":
        return Geopoint(*inner)
    if tag == "e":
        return _entity_from_json(inner)
    raise GatewayError(f"corrupt stored value with unknown tag {tag!r}")


def _entity_to_json(entity: RawEntity) -> dict[str, Any]:
    data = {
        "k": _key_to_json(entity.key) if entity.key is not None else None,
        "p": {name: _to_json(value) for name, value in entity.properties.items()},
        "u": sorted(entity.unindexed),
    }
    if entity.meanings:  # only then: an entity without meanings is stored as it always was
        data["m"] = _meanings_to_json(entity)
    return data


def _meanings_to_json(entity: RawEntity) -> dict[str, Any]:
    """The meanings stored with ``entity`` (``meanings.kept``): a list's as a JSON list."""
    out = {}
    for name, meaning in entity.meanings.items():
        stored = kept(entity.properties[name], meaning, name not in entity.unindexed)
        if stored is not None:
            out[name] = list(stored) if isinstance(stored, tuple) else stored
    return out


def _entity_from_json(data: dict[str, Any], key: Key | None = None) -> RawEntity:
    if key is None and data["k"] is not None:
        key = _key_from_json(data["k"])
    entity = RawEntity(key, {name: _from_json(v) for name, v in data["p"].items()}, frozenset(data["u"]))
    if "m" in data:
        entity.meanings = {name: tuple(m) if isinstance(m, list) else m for name, m in data["m"].items()}
    return entity


def _encoder() -> Callable[[Any], str]:
    """``json.dumps(..., separators=(",", ":"))``, its encoder built once:
    ``JSONEncoder.encode`` builds its C encoder again at every call (half
    of a shard's encoding). The same text (``test_encoding``); the Python
    encoder where the C one is missing. No check for circular values: an
    entity's JSON is made afresh by ``_entity_to_json``, which never makes one."""
    python = json.JSONEncoder(separators=(",", ":"))
    if c_make_encoder is None:
        return python.encode
    chunks = c_make_encoder(None, python.default, encode_basestring_ascii, None, ":", ",", False, False, True)
    return lambda value: "".join(chunks(value, 0))


#: Every write's encoder (``_encoder``).
_encode = _encoder()


def dump_entity(entity: RawEntity) -> str:
    """The text stored in ``entities.data``."""
    return _encode(_entity_to_json(entity))


def dump_plain(key: Key, properties: dict[str, Any], unindexed: frozenset[str]) -> str:
    """``dump_entity`` of an entity whose values are all of ``ROUND_TRIP``
    types, which are their own JSON (``_to_json`` gives them back as they are)."""
    return _encode({"k": _key_to_json(key), "p": properties, "u": sorted(unindexed)})


def load_entity(text: str, key: Key | None = None) -> RawEntity:
    """The entity stored as ``text``, decoded afresh (a gateway's reads go
    through its ``Decodings``); ``key``, when the caller already holds the
    very key it was found under, is used instead of parsing the stored one."""
    return _entity_from_json(json.loads(text), key)


#: Index values by property name, as ``index_entries`` gives them.
Index = dict[str, list[tuple[bytes, Any]]]

#: Stored texts up to this many characters are decoded once and remembered.
REMEMBERED_TEXT = 4096

#: Values a remembered entity may hold: immutable, so callers can share them.
_SHAREABLE = (bool, int, float, str, bytes, _dt.datetime, Key, Geopoint)


#: A remembered decoding: the key, properties, unindexed names and index
#: values, and whether it is plain (``stable_index``: what ``_storage.masked_plain``
#: needs to write onto it without rebuilding it).
_Decoded = tuple[Key | None, dict[str, Any], frozenset[str], Index, bool]


#: How many decoded texts a gateway remembers (oldest forgotten first).
_REMEMBERED_ENTRIES = 8192


class Decodings:
    """One gateway's stored texts -> their decoding (``_decode``): a hot
    entity (a counter shard) is read far more often than it changes, and
    decoding it (JSON, then a validated Key) was most of a query's time.
    The decoding is a pure function of the text, so a remembered one is
    never stale: a row another process rewrote holds another text. Shared
    by the gateway's threads (each step is one dict call under the GIL) and
    kept by a forked child (it still holds true there). Owned by the
    gateway, not the module: it goes when the gateway does."""

    __slots__ = ("_remembered",)

    def __init__(self) -> None:
        self._remembered: dict[str, _Decoded | None] = {}

    def _decoded(self, text: str) -> _Decoded | None:
        try:
            return self._remembered[text]
        except KeyError:
            pass
        decoded = _decode(text)
        self._remember(text, decoded)
        return decoded

    def _remember(self, text: str, decoded: _Decoded | None) -> None:
        remembered = self._remembered
        if len(remembered) >= _REMEMBERED_ENTRIES:
            try:  # the oldest; another thread may forget it first
                del remembered[next(iter(remembered))]
            except (KeyError, RuntimeError, StopIteration):
                pass
        remembered[text] = decoded

    def remember_written(self, text: str, entity: RawEntity, entries: Iterable[tuple[str, bytes, Any]]) -> None:
        """Remember that ``text``, just made by ``dump_entity(entity)``, decodes
        to ``entity`` with the index ``entries`` (``index_entries(entity)``),
        so that the next write or read of the row need not decode what this
        gateway wrote: a counter shard's ``add()`` writes a new text every
        time, and decoding it back was a fifth of a lone ``add()``'s engine
        time. Only when decoding the text would give exactly that (values of
        plain JSON types, a key without a project, which the text does not
        hold); else nothing is remembered and the text is decoded when read."""
        key = entity.key
        if len(text) > REMEMBERED_TEXT or key is None or key.project is not None or entity.meanings:
            return
        if not all(type(value) in ROUND_TRIP for value in entity.properties.values()):
            return
        index = _index(entries)
        self._remember(text, (key, dict(entity.properties), entity.unindexed, index, stable_index(index)))

    def remember_plain(self, text: str, key: Key, properties: dict[str, Any], unindexed: frozenset[str], index: Index) -> None:
        """``remember_written`` for a caller that knows already that every
        value is of a ``ROUND_TRIP`` type, ``key`` has no project and
        ``index`` is the entity's (``_storage.masked_plain``); ``properties`` is
        given to this memory, never changed by the caller again."""
        if len(text) <= REMEMBERED_TEXT:
            self._remember(text, (key, properties, unindexed, index, stable_index(index)))

    def plain(self, text: str) -> _Decoded | None:
        """The remembered decoding of ``text`` (decoded now if it is not
        remembered yet) when it is plain (``ROUND_TRIP`` values, ``stable_index``); else None."""
        decoded = self._decoded(text) if len(text) <= REMEMBERED_TEXT else None
        return decoded if decoded is not None and decoded[4] else None

    def load_indexed(self, text: str, key: Key | None = None) -> tuple[RawEntity, Index | None]:
        """``load_entity``, and the entity's index values when they are known
        (None: compute them from the entity). Each call returns its own
        ``RawEntity`` and properties dict, so a caller that changes one
        changes nobody else's; the values in it are immutable and shared."""
        decoded = self._decoded(text) if len(text) <= REMEMBERED_TEXT else None
        if decoded is None:
            return _entity_from_json(json.loads(text), key), None
        stored_key, properties, unindexed, index, _ = decoded
        return RawEntity(key if key is not None else stored_key, dict(properties), unindexed), index

    def finder(self) -> Callable[[str], _Decoded | None]:
        """A function giving the remembered decoding of a text (None: none
        remembered, or one that is not remembered because it cannot be,
        both read through ``load_indexed``), for a loop over many rows
        (``_query_batches``: a counter's total reads twenty). Only for texts
        of at most ``REMEMBERED_TEXT`` characters: a longer one is never
        remembered, and finding it would hash it whole."""
        return self._remembered.get

    def load_entity(self, text: str, key: Key | None = None) -> RawEntity:
        """The entity stored as ``text``; ``key``, when the caller already holds
        the very key it was found under (a lookup), is used instead of parsing
        and validating the stored one again."""
        return self.load_indexed(text, key)[0]


def _decode(text: str) -> _Decoded | None:
    """A stored text decoded, with its index values. None for entities
    holding a mutable value (a list, an embedded entity) or meanings,
    which are decoded afresh on every read."""
    entity = _entity_from_json(json.loads(text))
    if entity.meanings or not all(value is None or isinstance(value, _SHAREABLE) for value in entity.properties.values()):
        return None  # (a remembered decoding holds no meanings: ``load_indexed`` makes the entity without them)
    try:
        index = _index(index_entries(entity))
    except BadValueError:
        return None  # not indexable here: the query that needs it says so itself
    plain = all(type(value) in ROUND_TRIP for value in entity.properties.values()) and stable_index(index)
    return entity.key, entity.properties, entity.unindexed, index, plain


#: Values whose JSON round trip gives back an equal value of the same type
#: (a datetime comes back in UTC, a Key without its project).
ROUND_TRIP = frozenset({type(None), bool, int, float, str})


#: Values whose index encoding never changed: the index rows an older
#: release wrote for them are the ones ``index_entries`` gives today (the
#: encodings of floats, NaN and -0.0 among them, geopoints and timestamps
#: changed), so rows can be known from the entity or the filter alone.
STABLE_ENCODING = (str, bytes, int, Key, type(None))


def stable_index(index: Index) -> bool:
    """Whether every indexed value is of a ``STABLE_ENCODING`` type. Of a
    plain entity (``ROUND_TRIP`` values): whether no indexed value is a
    float, whose rows a file written before NaN and -0.0 took their
    encodings may hold in the older one (so ``_storage.masked_plain``
    cannot tell them unchanged without reading them)."""
    for values in index.values():
        for _, value in values:
            if not isinstance(value, STABLE_ENCODING):
                return False
    return True


def _index(entries: Iterable[tuple[str, bytes, Any]]) -> Index:
    """``index_entries`` grouped by property name."""
    index: Index = {}
    for name, enc, value in entries:
        index.setdefault(name, []).append((enc, value))
    return index


