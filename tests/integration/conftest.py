"""Fixtures for tests against real servers: NATS with JetStream and a Redis-compatible cache.

One server of each per session, embedded from the wheels on free ports, or the ones at
``KOI_NATS_URL`` / ``KOI_REDIS_URL`` when those are set (never the system's defaults).
``bus`` hands each test a connected ``Bus`` with every Koi stream and bucket present and
empty. Tests that stop or kill a server get their own from ``own_nats`` / ``own_valkey``.
``secure_nats`` is a NATS with TLS and one user per role (services/runtime/security.py),
and two submitters besides ``client``, ``SUBMITTERS``;
``secure_bus`` connects to it as admin, with the same clean state as ``bus``.
``nats_for_run`` is a NATS with no Koi state for a whole bus run (``BusRun``): a fresh
embedded one, or the one at ``KOI_NATS_URL`` emptied; ``module_nats_for_run`` is the same
for one run a module's tests share.
``language_model`` is an OpenAI-compatible endpoint with a real model: the embedded
llama-server (``make lm``) started once per session, or ``KOI_RLM_BASE_URL`` /
``KOI_RLM_MODEL`` when set; its tests fail, not skip, when neither is there.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio

from services.runtime.bus import Bus
from services.runtime.connection import connect, delete_koi_state
from services.runtime.embedded import EmbeddedServer, start_nats, start_valkey
from services.runtime.permissions import ADMIN
from services.runtime.security import connect_nats

SUBMITTERS = ("alice", "bob")  # secure_nats's submitters besides `client`


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    external = os.environ.get("KOI_NATS_URL")
    if external:
        yield external
        return
    server = start_nats()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def language_model() -> Iterator[tuple[str, str]]:
    """(base URL, model name) of a live model."""
    external = os.environ.get("KOI_RLM_BASE_URL")
    if external:
        yield external, os.environ.get("KOI_RLM_MODEL", "")
        return
    from services.runtime.lm import start_model

    model = start_model()  # EmbeddedServerError names `make lm` when it is not set up
    try:
        yield model.base_url, model.name
    finally:
        model.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    external = os.environ.get("KOI_REDIS_URL")
    if external:
        yield external
        return
    server = start_valkey()
    try:
        yield server.url
    finally:
        server.stop()


async def reset_koi_state(bus: Bus) -> None:
    """Every Koi stream and bucket, empty and without consumers: tests start clean."""
    await delete_koi_state(bus.js)
    await bus.ensure_streams()
    await bus.ensure_kv()


@pytest.fixture(scope="session")
def secure_nats() -> Iterator[EmbeddedServer]:
    """An embedded NATS requiring TLS and a password, one user per role;
    ``secure_nats.security`` holds the CA and each user's password file."""
    server = start_nats(secure=True, submitters=SUBMITTERS)
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture
async def secure_bus(secure_nats: EmbeddedServer) -> AsyncIterator[Bus]:
    connected = await connect(secure_nats.url, "test-admin", wait_s=10,
                              auth=secure_nats.security.auth(ADMIN))
    await reset_koi_state(connected)
    try:
        yield connected
    finally:
        await connected.close()


@pytest_asyncio.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    connected = await connect(nats_url, "test", wait_s=10)
    await reset_koi_state(connected)
    try:
        yield connected
    finally:
        await connected.close()


def _own(start: Callable[[], EmbeddedServer]) -> Iterator[Callable[[], EmbeddedServer]]:
    started: list[EmbeddedServer] = []

    def make() -> EmbeddedServer:
        started.append(start())
        return started[-1]

    try:
        yield make
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def own_nats() -> Iterator[Callable[[], EmbeddedServer]]:
    """A factory of private embedded NATS servers, all stopped after the test."""
    yield from _own(start_nats)


@pytest.fixture
def own_valkey() -> Iterator[Callable[[], EmbeddedServer]]:
    """A factory of private embedded Valkey servers, all stopped after the test."""
    yield from _own(start_valkey)


@pytest.fixture
def nats_for_run(own_nats: Callable[[], EmbeddedServer]) -> str:
    """A NATS with no Koi state: a fresh embedded one, or KOI_NATS_URL emptied."""
    external = os.environ.get("KOI_NATS_URL")
    if external:
        asyncio.run(_empty(external))
        return external
    return own_nats().url


@pytest.fixture(scope="module")
def module_nats_for_run() -> Iterator[str]:
    """``nats_for_run`` for a module-scoped fixture (one run whose results several tests
    read): a fresh embedded NATS, stopped after the module, or KOI_NATS_URL emptied."""
    external = os.environ.get("KOI_NATS_URL")
    if external:
        asyncio.run(_empty(external))
        yield external
        return
    server = start_nats()
    try:
        yield server.url
    finally:
        server.stop()


async def _empty(url: str) -> None:
    nc = await connect_nats(url)
    await delete_koi_state(nc.jetstream())
    await nc.close()
