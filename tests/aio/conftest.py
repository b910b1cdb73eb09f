"""Fixtures for the asyncio face: ``make_async_gateway(name)`` gives a fresh
async gateway on the kind of storage ``make_gateway(name)`` would (memory,
sqlite, or an official emulator in a namespace of its own), closed after
the test. Tests drive their own event loop with ``asyncio.run``."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from gds_counter.aio import async_twin
from gds_counter.gateway.datastore import DatastoreGateway


@pytest.fixture
def make_async_gateway(request: pytest.FixtureRequest, make_gateway: Any) -> Callable[..., Any]:
    def make(name: str, **options: Any) -> Any:
        blocking = make_gateway(name)
        if isinstance(blocking, DatastoreGateway):
            from gds_counter.gateway.datastore._async_gateway import AsyncDatastoreGateway

            # A namespace of its own: make_gateway(name) hands a test one
            # emulator gateway, whose namespace a blocking twin may be using.
            gateway: Any = AsyncDatastoreGateway(
                blocking.project, f"{blocking.namespace}-aio", emulator_host=blocking.emulator_host or "", **options
            )
        else:
            gateway = async_twin(blocking, owns=False, **options)
        request.addfinalizer(lambda: asyncio.run(gateway.close()))
        return gateway

    return make
