"""One attach test suite over both implementations.

A test whose ``world`` fixture takes ``attach_kind`` runs twice: through the
Python ``streamd attach`` and through the compiled ``streamd-attach``. A test
marked ``no_attach`` (it speaks to the daemon or ``Client.connect`` only)
runs once. Where ``streamd-attach`` was not built (pip builds it only when
cargo is there), its runs are skipped saying so; under CI (``CI=true``) with
cargo on the PATH that is a failure: CI must test what it ships.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.resident import ATTACHES, native_attach


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "attach_kind" in metafunc.fixturenames and not metafunc.definition.get_closest_marker(
        "no_attach"
    ):
        metafunc.parametrize("attach_kind", ATTACHES, indirect=True)


@pytest.fixture
def attach_kind(request: pytest.FixtureRequest) -> str:
    kind = getattr(request, "param", "python")
    if kind == "native":
        _native_or_skip()
    return kind


@pytest.fixture
def streamd_attach() -> Path:
    """The installed ``streamd-attach``, for a test of it alone."""
    return _native_or_skip()


def _native_or_skip() -> Path:
    path = native_attach()
    if path is None:
        why = ("streamd-attach is not installed beside this Python (pip builds it only when "
               "cargo is present; `streamd attach` serves without it)")
        if os.environ.get("CI", "").lower() in ("true", "1", "yes") and shutil.which("cargo"):
            pytest.fail(f"{why}; under CI=true with cargo present it must be built")
        pytest.skip(why)
    return path
