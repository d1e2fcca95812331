"""What a user's type checker sees of streamd's public names: checked by mypy
(``mypy tests/typing``), never run. Each ``assert_type`` fails if the name
resolves to ``Any`` (as a lazy package face's ``__getattr__`` alone makes it)
or to another type than the one its module defines."""

from __future__ import annotations

from pathlib import Path
from typing import assert_type

import streamd
import streamd.client
import streamd.eventlog
import streamd.rpc
from streamd.client.asyncio_client import AsyncClient, AsyncLease, AsyncWatch
from streamd.client.protocol import Call, ClientProtocol
from streamd.client.sync import Client, Lease, Watch
from streamd.client.trio_client import TrioClient, TrioLease, TrioWatch
from streamd.errors import RpcError
from streamd.eventlog.lease import Lease as LogLease
from streamd.eventlog.log import EventLog, EventLogStats
from streamd.eventlog.model import Event, RetentionPolicy, SessionWithEvents
from streamd.eventlog.postgres.store import PostgresStore
from streamd.eventlog.sqlite.store import SqliteStore
from streamd.eventlog.store.backend import Backend, Runner
from streamd.eventlog.watch import Watch as LogWatch
from streamd.rpc.methods import Connection, Method, MethodTable, Request
from streamd.rpc.server import Server


def client_face(
    trio_client: streamd.client.TrioClient,
    sync_client: streamd.client.Client,
    async_client: streamd.client.AsyncClient,
    call: streamd.client.Call[SessionWithEvents],
) -> None:
    assert_type(streamd.client.TrioClient, type[TrioClient])
    assert_type(streamd.client.TrioLease, type[TrioLease])
    assert_type(streamd.client.TrioWatch, type[TrioWatch])
    assert_type(streamd.client.Client, type[Client])
    assert_type(streamd.client.Lease, type[Lease])
    assert_type(streamd.client.Watch, type[Watch])
    assert_type(streamd.client.AsyncClient, type[AsyncClient])
    assert_type(streamd.client.AsyncLease, type[AsyncLease])
    assert_type(streamd.client.AsyncWatch, type[AsyncWatch])
    assert_type(streamd.client.ClientProtocol, type[ClientProtocol])
    # Instances, through annotations written with the package's names.
    assert_type(trio_client, TrioClient)
    assert_type(sync_client, Client)
    assert_type(async_client, AsyncClient)
    assert_type(call, Call[SessionWithEvents])


def eventlog_face(log: streamd.eventlog.EventLog, store: streamd.eventlog.Backend) -> None:
    assert_type(streamd.eventlog.EventLog, type[EventLog])
    assert_type(streamd.eventlog.EventLogStats, type[EventLogStats])
    assert_type(streamd.eventlog.Event, type[Event])
    assert_type(streamd.eventlog.RetentionPolicy, type[RetentionPolicy])
    assert_type(streamd.eventlog.SqliteStore, type[SqliteStore])
    assert_type(streamd.eventlog.Lease, type[LogLease])
    assert_type(streamd.eventlog.Watch, type[LogWatch])
    assert_type(streamd.eventlog.new_holder_id(), str)
    assert_type(streamd.eventlog.resolve_db_path(), Path | str)
    assert_type(streamd.eventlog.closed_error(), RpcError)
    assert_type(log, EventLog)
    assert_type(store, Backend)


def stores_are_backends(sqlite: SqliteStore, postgres: PostgresStore) -> None:
    # Structural: each store has every operation of the protocol, typed alike.
    backends: list[Backend] = [sqlite, postgres]
    runner: Runner = sqlite
    assert_type(backends, list[Backend])
    assert_type(runner, Runner)


def rpc_face(table: streamd.rpc.MethodTable) -> None:
    assert_type(streamd.rpc.Server, type[Server])
    assert_type(streamd.rpc.Connection, type[Connection])
    assert_type(streamd.rpc.Request, type[Request])
    assert_type(streamd.rpc.Method, type[Method])
    assert_type(table, MethodTable)
    assert_type(streamd.rpc.encode_result(1, None), bytes)
    assert_type(streamd.rpc.encode_notification("m", None), bytes)


def top_level() -> None:
    assert_type(streamd.RpcError, type[RpcError])
    assert_type(streamd.is_closed(RpcError(0, "")), bool)


def unknown_names_are_not_any() -> None:
    # The faces' __getattr__ answers object: a misspelt name is not a silent Any.
    assert_type(streamd.client.TrioClinet, object)
    assert_type(streamd.eventlog.EventLgo, object)
    assert_type(streamd.rpc.Sever, object)
