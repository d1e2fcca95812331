"""The benched process: ``python -m streamd`` (or the reference adapter) on
pipes, its requests with deadlines, and its memory (RSS, and PSS over the
process and its workers), for ``run_bench.py``."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

try:
    import psutil
except ImportError:  # psutil is optional: /proc gives RSS too
    psutil = None


class BenchError(Exception):
    pass


# -- machine facts -----------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def machine_facts() -> dict:
    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    dirty = _git("status", "--porcelain", "--", "src")
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores_logical": os.cpu_count(),
        "cores_physical": psutil.cpu_count(logical=False) if psutil else None,
        "cpu_model": cpu_model or platform.processor() or None,
        "memory_total_gib": round(psutil.virtual_memory().total / 2**30, 1) if psutil else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "versions": {
            d: _version(d) for d in ("recall-streamd", "trio", "msgspec", "numpy", "apsw", "psutil")
        },
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_src_dirty": bool(dirty) if dirty is not None else None,
    }


# -- the daemon on pipes -----------------------------------------------------------


def rfc3339(ns: int) -> str:
    s = np.datetime_as_string(
        np.array(ns, dtype="datetime64[ns]").astype("datetime64[s]"), unit="s"
    )
    return f"{s}Z"


def deadline_in(seconds: float) -> str:
    return rfc3339(time.time_ns() + int(seconds * 1e9) + 10**9)


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_of(pid: int) -> int | None:
    """Resident bytes of one process (/proc statm: cheap enough to sample often)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        if psutil is None:
            return None
        try:
            return psutil.Process(pid).memory_info().rss
        except psutil.Error:
            return None


def _pss_of(pid: int) -> int:
    """Proportional set size: shared pages split among the processes sharing them,
    so forked workers are not counted twice for pages they share with the parent."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return _rss_of(pid) or 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return "?"


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children", "rb") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


class Daemon:
    """One ``python -m streamd`` process in lockstep: one request, then its answer.

    The answer is read on the calling thread (select + os.read), so a latency
    is request write to answer line with no thread hand-off in between.
    """

    def __init__(self, cwd: Path, env: dict, sample_interval: float = 0.05,
                 argv: list[str] | None = None) -> None:
        self.t_spawn = time.perf_counter()
        self.proc = subprocess.Popen(
            argv or [sys.executable, "-m", "streamd"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.fd = self.proc.stdout.fileno()
        self.buf = bytearray()
        self.next_id = 1
        self.stderr_tail: deque[str] = deque(maxlen=200)
        # Peaks of the daemon process alone and of its whole process tree
        # (worker processes included): RSS sums double-count pages a forked
        # worker shares with its parent, PSS sums do not.
        self.peak_rss = 0
        self.phase_peak = 0
        self.peak_tree_rss = 0
        self.peak_tree_pss = 0
        self.phase_peak_tree = 0
        self.max_children = 0
        self._stop = threading.Event()
        self._stderr_reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_reader.start()
        self._sampler = threading.Thread(target=self._sample, args=(sample_interval,), daemon=True)
        self._sampler.start()

    def _drain_stderr(self) -> None:
        for raw in self.proc.stderr:
            self.stderr_tail.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def _sample(self, interval: float) -> None:
        while not self._stop.is_set():
            rss = _rss_of(self.pid)
            if rss is None:
                return
            self.peak_rss = max(self.peak_rss, rss)
            self.phase_peak = max(self.phase_peak, rss)
            kids = _descendants(self.pid)
            tree_rss, tree_pss = rss, rss
            if kids:
                self.max_children = max(self.max_children, len(kids))
                tree_rss += sum(_rss_of(k) or 0 for k in kids)
                tree_pss = _pss_of(self.pid) + sum(_pss_of(k) for k in kids)
            self.peak_tree_rss = max(self.peak_tree_rss, tree_rss)
            self.peak_tree_pss = max(self.peak_tree_pss, tree_pss)
            self.phase_peak_tree = max(self.phase_peak_tree, tree_pss)
            self._stop.wait(interval)

    def new_phase(self) -> None:
        self.phase_peak = self.phase_peak_tree = _rss_of(self.pid) or 0

    def memory(self, st: dict) -> dict:
        """Peak figures in MB; ``st`` is a fresh ``status()``."""
        main = max(self.peak_rss, st.get("VmHWM", 0))
        return {
            "peak_rss_mb": main / 2**20,
            "peak_tree_rss_mb": max(main, self.peak_tree_rss) / 2**20,
            "peak_tree_pss_mb": max(self.peak_tree_pss, main if not self.max_children else 0)
            / 2**20,
            "max_worker_processes": self.max_children,
        }

    def status(self) -> dict:
        """VmHWM (peak resident set), VmRSS in bytes, and CPU seconds used."""
        out = {}
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                key, _, rest = line.partition(":")
                if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(rest.split()[0]) * 1024
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            tick = os.sysconf("SC_CLK_TCK")
            out["cpu_s"] = (int(fields[11]) + int(fields[12])) / tick
            # CPU of worker processes the daemon has already waited for
            out["children_cpu_s"] = (int(fields[13]) + int(fields[14])) / tick
        except (OSError, IndexError, ValueError):
            pass
        return out

    def _fail(self, what: str) -> BenchError:
        code = self.proc.poll()
        tail = "\n".join(list(self.stderr_tail)[-15:])
        state = f"exited with {code}" if code is not None else "still running"
        return BenchError(f"{what} (daemon {state}); stderr tail:\n{tail}")

    def _read_line(self, deadline: float) -> bytes:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 1]
                return line
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                chunk = os.read(self.fd, 1 << 20)
                if not chunk:
                    raise EOFError
                self.buf += chunk

    def call(self, method: str, params: dict, timeout: float) -> tuple[dict, float]:
        """Send one request; return (the response frame, seconds until it arrived)."""
        rid = self.next_id
        self.next_id += 1
        frame = (
            json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()
            + b"\n"
        )
        t0 = time.perf_counter()
        try:
            self.proc.stdin.write(frame)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise self._fail(f"{method}: cannot write request ({exc})") from None
        deadline = t0 + timeout
        while True:
            try:
                line = self._read_line(deadline)
            except TimeoutError:
                raise self._fail(f"{method}: no answer within {timeout:.0f} s") from None
            except EOFError:
                raise self._fail(f"{method}: daemon closed stdout") from None
            t1 = time.perf_counter()
            try:
                msg = json.loads(line)
            except ValueError:
                raise self._fail(
                    f"{method}: stdout carried a non-JSON line: {line[:200]!r}"
                ) from None
            if isinstance(msg, dict) and msg.get("id") == rid:
                return msg, t1 - t0
            # Anything else (a stray frame) is noted and skipped.
            self.stderr_tail.append(f"[bench] unexpected frame: {line[:200]!r}")

    def result(self, method: str, params: dict, timeout: float) -> tuple[dict, float]:
        msg, dt = self.call(method, params, timeout)
        if "error" in msg:
            raise self._fail(f"{method} failed: {json.dumps(msg['error'])[:300]}")
        return msg["result"], dt

    def shutdown(self, timeout: float) -> dict:
        """recall/shutdown, then EOF; the process must exit 0 by itself."""
        out: dict = {}
        try:
            msg, dt = self.call("recall/shutdown", {}, timeout)
            out["shutdown_ms"] = dt * 1e3
            if msg.get("result") != {}:
                out["shutdown_answer"] = msg
            self.proc.stdin.close()
            code = self.proc.wait(timeout=timeout)
            out["exit_code"] = code
            rest = self.proc.stdout.read()
            if rest:
                out["bytes_after_shutdown"] = len(rest)
            self._stderr_reader.join(timeout=5)
            if self.stderr_tail:
                out["stderr_tail"] = list(self.stderr_tail)[-20:]
            # Workers that outlive the daemon could still be writing its workdir.
            # Give helpers that exit on their own (a resource tracker) a moment.
            grace = time.perf_counter() + 3
            left = self.group_members()
            while left and time.perf_counter() < grace:
                time.sleep(0.05)
                left = self.group_members()
            if left:
                out["left_running"] = len(left)
                out["left_running_cmdlines"] = [_cmdline(p) for p in left]
        except subprocess.TimeoutExpired:
            out["error"] = f"did not exit within {timeout:.0f} s after shutdown"
        except BenchError as exc:
            out["error"] = str(exc)
        finally:
            self.kill()
        return out

    def group_members(self) -> list[int]:
        """Processes still in the daemon's process group (it leads a new session)."""
        out = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.pid and fields[0] != b"Z":
                out.append(int(name))
        return out

    def kill(self) -> None:
        self._stop.set()
        if self.proc.poll() is None or self.group_members():
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass


# -- what to ask -------------------------------------------------------------------


