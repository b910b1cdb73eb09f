"""The php-gds port: Entity, Schema, Store, Key, Geopoint and GQL."""

from gds_counter.gateway.keys import Key
from gds_counter.gateway.values import Geopoint
from gds_counter.gds._mapper import from_raw, to_raw
from gds_counter.gds._store_core import StoreCore
from gds_counter.gds.entity import Entity
from gds_counter.gds.schema import PropertyType, Schema
from gds_counter.gds.store import Store
from gds_counter.gds.transaction import RetryPolicy

__all__ = ["Entity", "Geopoint", "Key", "PropertyType", "RetryPolicy", "Schema", "Store", "StoreCore", "from_raw", "to_raw"]
