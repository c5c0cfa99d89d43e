"""Stores to test against: memory and SQLite always; Redis, PostgreSQL and
MariaDB from IDEM_REDIS_URL, IDEM_POSTGRES_URL, IDEM_MYSQL_URL (or the local
servers). A missing server skips its tests with the reason, and fails them
when CI is set, as the Rust tests do."""

from __future__ import annotations

import os
import socket
import urllib.parse
import uuid

import pytest

SERVERS = {
    "redis": ("IDEM_REDIS_URL", "redis://127.0.0.1:6379", 6379),
    "postgres": ("IDEM_POSTGRES_URL", "postgres://root@127.0.0.1:5432/test", 5432),
    "mysql": ("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test", 3306),
}
STORES = ["memory", "sqlite", "redis", "postgres", "mysql"]


def server_url(name: str) -> str:
    """The server's URL, or a skip (a failure under CI) when nothing listens."""
    variable, default, port = SERVERS[name]
    url = os.environ.get(variable, default)
    parsed = urllib.parse.urlsplit(url)
    address = (parsed.hostname or "127.0.0.1", parsed.port or port)
    try:
        socket.create_connection(address, timeout=2).close()
    except OSError as error:
        reason = f"no {name} at {address[0]}:{address[1]} ({error}); set {variable}"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)")
        pytest.skip(reason)
    return url


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A URL of each store kind."""
    if request.param == "memory":
        return "memory"
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'idem.db'}"
    return server_url(request.param)


@pytest.fixture
def namespace() -> str:
    """A namespace of this test's own, so tests share no record."""
    return f"py-{uuid.uuid4().hex}"
