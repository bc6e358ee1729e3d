"""Real servers for the tests: a PostgreSQL (the machine's, named by VIDJOBS_TEST_DATABASE_URL, or an
embedded one from the pgserver wheel), a migrated template database cloned per test, and a nats-server
with JetStream started per test on a free port."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import botocore.session
import pytest
from botocore.config import Config

from tests.faults.postgres import LocalPostgres
from tests.s3server import TEST_BUCKET, MotoS3, aws_environment, moto_s3
from tests.support import processes_running, with_database
from vidjobs.cli.embedded import EmbeddedNats, EmbeddedPostgres
from vidjobs.common import db

pytest_plugins = ["tests.bytecode", "tests.scheduling"]


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("VIDJOBS_TEST_DATABASE_URL")
    if url:
        yield url
        return
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "data").start()
    try:
        asyncio.run(_without_durability(server.url))
        yield server.url
    finally:
        server.stop()


async def _without_durability(url: str) -> None:
    """The tests' own server need not survive a crash of the machine: commits and database copies skip fsync.
    (Tests that crash or restart PostgreSQL start servers of their own, with the defaults.) Commits stay
    synchronous: an asynchronous commit holds back hint bits until its WAL is flushed, so a VACUUM just after
    it leaves pages not all-visible, and tests of query plans would see plans no settled table gets."""
    conn = await asyncpg.connect(url)
    try:
        for name in ("fsync", "full_page_writes"):
            await conn.execute(f"ALTER SYSTEM SET {name} = off")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


@pytest.fixture(scope="session")
async def template_db(pg_admin_url: str) -> AsyncIterator[str]:
    name = f"vidjobs_tmpl_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(pg_admin_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await db.migrate(with_database(pg_admin_url, name))
    try:
        yield name
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def database_url(pg_admin_url: str, template_db: str) -> AsyncIterator[str]:
    """A fresh, migrated database for one test."""
    name = f"vidjobs_t_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(pg_admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    finally:
        await admin.close()
    yield with_database(pg_admin_url, name)
    admin = await asyncpg.connect(pg_admin_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def empty_database_url(pg_admin_url: str) -> AsyncIterator[str]:
    """A database of its own with nothing in it, not even the schema (for tests of migrating)."""
    name = f"vidjobs_empty_{secrets.token_hex(5)}"
    admin = await asyncpg.connect(pg_admin_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(pg_admin_url, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await db.create_pool(database_url, max_size=5)
    yield p
    await p.close()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A nats-server of this test's own, so streams and consumers never leak between tests."""
    server = EmbeddedNats(tmp_path / "nats").start()
    yield server
    server.stop()
    # A test that stops the server and starts it again does it through this object, which stops it here; one
    # started beside it on the same directory would run on after the test. Ended, and the test fails.
    left = processes_running(f"-c {server.store_dir / 'nats.conf'}")
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"nats-server processes of this test still running after it: {left}"


@pytest.fixture
def nats_url(nats_server: EmbeddedNats) -> str:
    return nats_server.url


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    """One S3-compatible server (moto, a real subprocess on loopback) for the session, with TEST_BUCKET made.
    Tests keep apart by key prefix. The AWS variables it sets are inherited by the service processes."""
    with moto_s3(tmp_path_factory.mktemp("moto")) as server, aws_environment(server):
        server.create_bucket(TEST_BUCKET)
        yield server


@pytest.fixture
def customer_bucket(s3_server: MotoS3) -> str:
    """A bucket of an account's own on the same S3 server (an export's destination): not the one the services
    store into."""
    name = f"customer-{secrets.token_hex(4)}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def s3_client(s3_server: MotoS3) -> Iterator[Any]:
    """A botocore S3 client of the test server: to presign a PUT as an account would, and to read what landed."""
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=s3_server.endpoint, region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
    yield client
    client.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client for one test, as the services hold one: adapters under test call through it."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[LocalPostgres]:
    """A PostgreSQL server of the test's own, for a test that stalls, restarts or reads the log of its server."""
    server = LocalPostgres(tmp_path / "pg").init().start()
    try:
        yield server
    finally:
        server.stop("immediate")
