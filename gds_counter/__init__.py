"""gds_counter: a php-gds style mapper for Google Cloud Datastore, and a
sharded counter that PHP and Python apps can share."""

__version__ = "0.1.0"

from gds_counter.counter import (  # noqa: E402
    NDB_GENERAL,
    PHP_ARTICLE,
    AutoGrow,
    CountCache,
    CounterOptions,
    CounterShardDS,
    CounterShardEntity,
    GeneralCounter,
    Layout,
    get_counts,
)
from gds_counter.errors import (  # noqa: E402
    AlreadyExists,
    BadKeyError,
    BadValueError,
    CommitUnknown,
    Contention,
    CorruptDataError,
    CountSaturated,
    GatewayError,
    GDSError,
    GQLError,
    NotFound,
    SchemaError,
    TotalUnavailable,
    TransformsIgnored,
    Unavailable,
)
from gds_counter.gateway import open_gateway  # noqa: E402
from gds_counter.gds import Entity, Geopoint, Key, PropertyType, RetryPolicy, Schema, Store  # noqa: E402

__all__ = [
    "__version__",
    "AutoGrow",
    "CountCache",
    "CounterOptions",
    "CounterShardDS",
    "CounterShardEntity",
    "GeneralCounter",
    "Layout",
    "NDB_GENERAL",
    "PHP_ARTICLE",
    "get_counts",
    "AlreadyExists",
    "BadKeyError",
    "BadValueError",
    "CommitUnknown",
    "CountSaturated",
    "Contention",
    "CorruptDataError",
    "Entity",
    "GatewayError",
    "GDSError",
    "Geopoint",
    "GQLError",
    "Key",
    "NotFound",
    "PropertyType",
    "RetryPolicy",
    "Schema",
    "SchemaError",
    "Store",
    "TotalUnavailable",
    "TransformsIgnored",
    "Unavailable",
    "open_gateway",
]
