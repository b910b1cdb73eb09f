"""The Cloud Firestore (native mode) gateway: Firestore's documents as the
gateway's entities, through google-cloud-firestore's GAPIC layer, which
gives exact control of writes (update masks, increments, preconditions).

google-cloud-firestore is an optional extra: importing this package
without it raises a ``GatewayError`` saying how to install it
(in a clone, ``pip install -e '.[firestore]'``); nothing else of gds_counter
imports it until a ``firestore://`` gateway is opened.

Split by idea, each module explaining its own part:

* ``_codec``: keys as documents, values, writes (docs/firestore.md, "The
  gateway", says what maps to what and how Firestore differs).
* ``_query``: a neutral query as a ``StructuredQuery``, and our cursors.
* ``_errors``: the Datastore gateway's error policy, for Firestore.
* ``_gateway``: ``FirestoreGateway``: the client, deadlines and retries,
  and the RPCs behind the gateway hooks.
"""

from gds_counter.errors import GatewayError

try:
    import google.cloud.firestore_v1  # noqa: F401  (the optional extra)
except ImportError as _missing:  # pragma: no cover - the dev extra installs it
    raise GatewayError(
        f"a firestore:// gateway needs google-cloud-firestore ({_missing}): install the firestore extra (in a clone: pip install -e '.[firestore]')"
    ) from _missing

from gds_counter.gateway.firestore._async_gateway import AsyncFirestoreGateway  # noqa: E402
from gds_counter.gateway.firestore._gateway import CAPABILITIES, FirestoreGateway  # noqa: E402

__all__ = ["CAPABILITIES", "AsyncFirestoreGateway", "FirestoreGateway"]
