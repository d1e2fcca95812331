"""``STREAMD_NATIVE=0``: the plain Python paths on purpose.

Every part that has a compiled twin (index builds, search scoring, the ADK
service's model rebuild, the event log's entries on the wire) keeps its
plain path as the definition, and takes it when this is set, for tests,
benches and a user who suspects the compiled core. Read at each use, so a
test can set it for one call.
"""

from __future__ import annotations

import os

__all__ = ["ENV", "asked"]

ENV = "STREAMD_NATIVE"


def asked() -> bool:
    """Whether the environment asks for the plain paths (``STREAMD_NATIVE=0``)."""
    return os.environ.get(ENV, "").strip() == "0"
