"""Input checks shared by every layer, so that one rule reads one way.

Datastore integers are signed 64-bit; Python's ``bool`` is an ``int`` subclass
that Datastore stores as a different type, so "an int" here never means a
bool. Each check names the bad value in its error, before anything is
written.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import TypeIs

from gds_counter.errors import BadValueError

__all__ = ["INT64_MAX", "INT64_MIN", "check_int", "is_int", "utf8_size"]

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


def utf8_size(text: str, what: str, error: type[BadValueError] = BadValueError) -> int:
    """Bytes in UTF-8, as Datastore counts them; a lone surrogate (what
    ``json.loads('"\\ud800"')`` gives) cannot be stored at all."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise error(f"{what} {text[:40]!r} is not valid Unicode ({exc.reason} at index {exc.start})") from None
