"""docs/configuration.md names every environment variable streamd reads, in
the Python package and in the compiled attach: one read added without a line
there fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = r"[\"']([A-Z][A-Z0-9_]+)[\"']"
READS = [
    re.compile(rf"environ(?:\.get|\.pop)?\(\s*{NAME}"),  # os.environ.get("X")
    re.compile(rf"environ\[\s*{NAME}\s*\]"),
    re.compile(rf"\benv(?:iron)?\.get\(\s*{NAME}"),  # a mapping passed in for tests
    re.compile(rf"getenv\(\s*{NAME}"),
    re.compile(rf"^[A-Z_]*(?:ENV|VARIABLE)[A-Z_]* = {NAME}", re.M),  # a named constant
    re.compile(rf"env::var(?:_os)?\(\s*{NAME}"),  # Rust
    re.compile(rf"\b_?xdg\(\s*(?:env,\s*)?{NAME}"),  # the XDG helpers of both
]
# What only the build or a profiling example reads, never the installed program.
BUILD_ONLY = {"CARGO_MANIFEST_DIR", "OUT_DIR", "FEED_ONLY", "CHUNK_MB", "ROUNDS"}


def read_variables() -> set[str]:
    sources = [*(REPO / "src" / "streamd").rglob("*.py"), *(REPO / "native").rglob("*.rs")]
    return {name for path in sources for pattern in READS
            for name in pattern.findall(path.read_text())} - BUILD_ONLY


def test_the_scan_sees_the_variables_read_in_each_language():
    assert {"STREAMD_DB", "STREAMD_NO_INOTIFY", "NO_COLOR", "HOME", "PGAPPNAME",
            "STREAMD_RUNTIME_DIR", "OPENBLAS_NUM_THREADS", "XDG_RUNTIME_DIR"} <= read_variables()


def test_every_environment_variable_streamd_reads_is_on_the_configuration_page():
    page = (REPO / "docs" / "configuration.md").read_text()
    missing = sorted(v for v in read_variables() if not re.search(rf"(?<!\w){v}\b", page))
    assert missing == []
