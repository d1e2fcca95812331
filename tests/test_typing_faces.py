"""The lazy package faces say to type checkers what they give at run time:
the ``if TYPE_CHECKING:`` re-exports name the same objects, from the same
modules, as ``_EXPORTS`` (what ``__getattr__`` imports). mypy checks what
those names are (tests/typing/check_public_types.py); this keeps the two lists
from drifting apart."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

FACES = ["streamd.client", "streamd.rpc", "streamd.eventlog"]


def _type_checking_imports(module_name: str) -> dict[str, str]:
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom), ast.unparse(stmt)
                for alias in stmt.names:
                    # "X as X": an explicit re-export, which a checker honours.
                    assert alias.asname == alias.name, ast.unparse(stmt)
                    assert stmt.module is not None
                    found[alias.name] = stmt.module
    return found


@pytest.mark.parametrize("face", FACES)
def test_type_checking_reexports_match_the_lazy_table(face: str) -> None:
    module = importlib.import_module(face)
    assert _type_checking_imports(face) == module._EXPORTS
    assert sorted(module.__all__) == sorted(module._EXPORTS)


@pytest.mark.parametrize("face", FACES)
def test_each_lazy_name_is_the_object_of_its_module(face: str) -> None:
    module = importlib.import_module(face)
    for name, source in module._EXPORTS.items():
        assert getattr(module, name) is getattr(importlib.import_module(source), name)
