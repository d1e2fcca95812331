"""A stream file that cannot be opened for a reason that is not the file's own
(the process is out of descriptors) is reported as that reason, on the plain
and the compiled read path alike, not as "not readable" (which sends people to
the file's permissions).

The descriptors really run out: a fresh interpreter lowers its RLIMIT_NOFILE
and takes every descriptor left before it reads.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamd.errors import RpcError
from streamd.recall.index import streamfile

OUT_OF_DESCRIPTORS = """
import errno, json, os, resource, sys
from streamd.errors import RpcError
from streamd.recall.index import build, streamfile
from streamd.recall.index.index import Index
from streamd.recall.index.streamfile import Cursor

path = sys.argv[1]
reads = {
    "plain": lambda: list(streamfile.lines_after(path, 0)),
    "consumer": lambda: list(build.Consumer(Index(), 0, 0).read_into(Cursor(path), 0)),
}
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError as exc:
    assert exc.errno == errno.EMFILE, exc
out = {}
for name, read in reads.items():
    try:
        read()
        out[name] = "read"
    except RpcError as exc:
        out[name] = [exc.code, exc.message]
print(json.dumps(out))
"""


@pytest.mark.parametrize("native", ["0", "1"])
def test_running_out_of_descriptors_is_named_not_called_unreadable(
    tmp_path: Path, native: str
) -> None:
    stream = tmp_path / "a.jsonl"
    stream.write_text('{"id": "e1"}\n')
    done = subprocess.run([sys.executable, "-c", OUT_OF_DESCRIPTORS, str(stream)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "STREAMD_NATIVE": native})
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    expected = [-32000, "a.jsonl cannot be opened: Too many open files (EMFILE)"]
    assert said == {"plain": expected, "consumer": expected}


def test_the_files_own_refusals_still_say_not_readable(tmp_path: Path) -> None:
    # A directory in the reference's words: it opens one and fails its read.
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(RpcError, match=r"^dir.jsonl became unreadable$"):
        list(streamfile.lines_after(str(tmp_path / "dir.jsonl"), 0))
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(RpcError, match=r"^fifo.jsonl is not readable$"):
        list(streamfile.lines_after(str(tmp_path / "fifo.jsonl"), 0))
    denied = OSError(errno.EACCES, "Permission denied")
    assert streamfile.cannot_open("a.jsonl", denied).message == "a.jsonl is not readable"
    failed = OSError(errno.EIO, "Input/output error")
    assert streamfile.read_failed("a.jsonl", failed).message == \
        "a.jsonl became unreadable: Input/output error (EIO)"
