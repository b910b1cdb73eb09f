"""The Cloud Datastore gateway: Cloud Datastore, Firestore in Datastore mode,
or either official emulator, through google-cloud-datastore's GAPIC layer.

Why the low-level GAPIC client and raw ``datastore_v1`` protos instead of
``google.cloud.datastore.Client``: the high-level client decides index flags
per entity (not per list element), has no property masks or property
transforms, and cannot send GQL. php-gds compatibility needs all of those, so
this package builds every request itself.

Split by idea, each module explaining its own part:

* ``_retry``: the retry and error policy (its docstring holds the policy
  table the README quotes); ``should_retry`` and ``translate_error``.
* ``_budget``: ``CallBudget``, one request under that policy and one
  deadline, blocking or awaited.
* ``_codec``: neutral keys, values, entities, filters, queries, GQL bindings
  and mutations to and from raw protobufs.
* ``_requests``: the requests of both gateways, as plans.
* ``_gateway``: ``DatastoreGateway`` itself: the blocking client.
* ``_async_gateway``: ``AsyncDatastoreGateway``: the same on gRPC asyncio.
"""

from gds_counter.gateway.datastore._async_gateway import AsyncDatastoreGateway
from gds_counter.gateway.datastore._budget import CallBudget
from gds_counter.gateway.datastore._codec import Codec
from gds_counter.gateway.datastore._gateway import DatastoreGateway
from gds_counter.gateway.datastore._requests import strip_scheme
from gds_counter.gateway.datastore._retry import (
    DEFAULT_ASYNC_RETRY,
    DEFAULT_RETRY,
    error_message,
    should_retry,
    translate_error,
)

# The retry and error policy (``_retry``'s table), the deadline and retries
# of each call (``CallBudget``) and ``strip_scheme`` are the Firestore
# gateway's too (``gateway.firestore``): one policy.
__all__ = [
    "AsyncDatastoreGateway", "CallBudget", "Codec", "DatastoreGateway", "DEFAULT_ASYNC_RETRY", "DEFAULT_RETRY",
    "error_message", "should_retry", "strip_scheme", "translate_error",
]
