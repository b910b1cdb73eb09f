"""Input checks shared by every layer, so that one rule reads one way.

Datastore integers are signed 64-bit; Python's ``bool`` is an ``int`` subclass
that Datastore stores as a different type, so "an int" here never means a
bool. Each check names the bad value in its error, before anything is
written.
"""

from __future__ import annotations

import re
from typing import Any

from typing_extensions import TypeIs

from gds_counter.errors import BadValueError

__all__ = ["INT64_MAX", "INT64_MIN", "check_amount", "check_int", "check_text", "is_int", "lone_surrogate", "utf8_size"]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def is_int(value: Any) -> TypeIs[int]:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(
    value: Any,
    what: str,
    *,
    low: int | None = INT64_MIN,
    high: int | None = INT64_MAX,
    error: type[BadValueError] = BadValueError,
) -> int:
    """Return ``value`` if it is an int (not a bool) within ``low..high``
    (inclusive; None is unbounded); raise ``error`` naming ``what`` otherwise.
    The default range is Datastore's 64-bit integer."""
    if not is_int(value):
        raise error(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if low is not None and value < low:
        raise error(f"{what} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise error(f"{what} must be at most {high}, got {value}")
    return int(value)


def check_amount(amount: Any) -> int:
    """An amount a counter may add: an int whose negation is one too (so a
    ``decrement`` of it is), refused before anything is read or written."""
    return check_int(amount, "amount", low=-INT64_MAX)


#: A code point of the surrogate range: a Python ``str`` may hold one alone
#: (``json.loads('"\\ud800"')`` or ``b"\\xed\\xa0\\x80".decode("utf-8",
#: "surrogateescape")`` give one), but no UTF-8 text, and so no Datastore
#: string, key, name or GQL text, can.
_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(text: str) -> int | None:
    """The index of the first surrogate code point in ``text``; None when
    ``text`` is valid Unicode (it then encodes to UTF-8). ASCII text, the
    common case, is answered without a scan (``isascii`` reads a flag)."""
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def check_text(text: str, what: str, error: type[BadValueError] = BadValueError) -> str:
    """Return ``text`` if it can be stored; raise ``error`` naming ``what``
    and the index of the lone surrogate otherwise. Checked before anything
    is sent, so the refusal is a ``GDSError`` (not ``UnicodeEncodeError``
    from whichever encoder meets it first) and nothing has been written."""
    index = lone_surrogate(text)
    if index is not None:
        raise error(
            f"{what} {text[:40]!r} is not valid Unicode (a lone surrogate {text[index]!r} at index {index}; "
            "surrogates not allowed in UTF-8)"
        )
    return text


def utf8_size(text: str, what: str, error: type[BadValueError] = BadValueError) -> int:
    """Bytes in UTF-8, as Datastore counts them; a lone surrogate cannot be
    stored at all (``check_text``)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        check_text(text, what, error)
        raise  # unreachable: only surrogates fail to encode
