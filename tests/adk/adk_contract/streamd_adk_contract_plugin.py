"""A pytest plugin that holds streamd to Google ADK's session-service contract.

ADK's contract tests (``tests/unittests/sessions/test_session_service.py``)
take a ``session_service`` fixture whose values are ADK's registered backends
(``BACKENDS`` in ``_conformance.py`` beside it). This plugin adds
``StreamdSessionService`` as one more value, named ``streamd``: each test that
takes the fixture runs once more, on a daemon of its own (``streamd`` spawned on
stdio, its database in the test's ``tmp_path``), with ADK's test body unchanged.

It parametrizes the fixture from the test's side (a ``parametrize`` mark with
``indirect=True``, which pytest gives precedence over the fixture's own
params), so ADK's fixture function still builds every backend, xfails its
recorded divergences, and closes it. A test that parametrizes the fixture
itself (a test of one backend) is left alone.

Use, from a copy of ADK's ``tests`` tree, outside streamd's own pytest
configuration (which runs every async test on Trio)::

    PYTHONPATH=<streamd>/tests/adk/adk_contract python -m pytest \\
        -p streamd_adk_contract_plugin -o asyncio_mode=auto \\
        tests/unittests/sessions/test_session_service.py -k streamd

Options: ``--streamd-write-behind`` runs the service with ``write_behind=True``
(each test's events flushed before the service closes); ``--streamd-in-process``
runs it on the log in the test's own process (``database=``, no daemon);
``--streamd-daemon-arg`` (repeatable) is passed to each daemon
(``--synchronous NORMAL``, say).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import pathlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest

FIXTURE = "session_service"
NAME = "streamd"


@dataclasses.dataclass(frozen=True)
class StreamdBackend:
    """What ADK's fixture reads of a backend: a name, a factory, and the
    contract tests it is known to fail (none)."""

    name: str
    make: Callable[[pathlib.Path], contextlib.AbstractAsyncContextManager[Any]]
    divergences: Mapping[str, str] = dataclasses.field(default_factory=dict)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("streamd", "streamd as an ADK session backend")
    group.addoption("--streamd-write-behind", action="store_true",
                    help="run StreamdSessionService with write_behind=True")
    group.addoption("--streamd-in-process", action="store_true",
                    help="run StreamdSessionService on a log in this process (database=)")
    group.addoption("--streamd-daemon-arg", action="append", default=[],
                    help="an argument for each streamd daemon (repeatable)")


def _backend(config: pytest.Config) -> StreamdBackend:
    write_behind = bool(config.getoption("streamd_write_behind"))
    daemon_args = list(config.getoption("streamd_daemon_arg"))
    in_process = bool(config.getoption("streamd_in_process"))

    @contextlib.asynccontextmanager
    async def make(tmp_path: pathlib.Path) -> AsyncIterator[Any]:
        # Imported here: the plugin loads before the test session sets ADK's
        # environment up, and importing streamd.adk imports ADK.
        from streamd.adk import StreamdSessionService
        from streamd.client import AsyncClient

        database = tmp_path / "streamd.db"
        if in_process:
            service = StreamdSessionService(database=database, write_behind=write_behind)
            try:
                yield service
                await service.flush()
            finally:
                await service.close()
            return
        client = await AsyncClient.spawn(["--db", str(database), *daemon_args])
        try:
            service = StreamdSessionService(client, write_behind=write_behind)
            yield service
            await service.flush()
        finally:
            await client.aclose()

    return StreamdBackend(NAME, make)


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if FIXTURE not in metafunc.fixturenames:
        return
    if any(FIXTURE in _argnames(m) for m in metafunc.definition.iter_markers("parametrize")):
        return  # the test chose its backends itself
    package = metafunc.module.__package__ or ""
    registry = importlib.import_module(f"{package}._conformance" if package else "_conformance")
    backends = [*registry.BACKENDS, _backend(metafunc.config)]
    metafunc.definition.add_marker(
        pytest.mark.parametrize(FIXTURE, backends, indirect=True, ids=lambda b: b.name)
    )


def _argnames(mark: pytest.Mark) -> list[str]:
    names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
    if isinstance(names, str):
        return [n.strip() for n in names.split(",")]
    return list(names)
