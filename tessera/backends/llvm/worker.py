"""The compile worker: one child process per Tessera process that runs LLVM for it (`optimize.py --serve`).

    reply = compile_in_worker(request, timeout_s=180.0, backend="NVPTX")

LLVM is built with assertions and has bugs that loop forever on some
inputs; in this process either would take the user's program down. The
worker is started on first use (`prepare()` starts it early, so Python's
and LLVM's start-up overlap with code generation in this process), serves
one request at a time, and is reused across compiles. What can go wrong
stays there:

* a crash (an LLVM abort, the OOM killer) is a `BackendError` naming the
  kernel and target, with the end of what LLVM wrote on stderr; the next
  compile starts a fresh worker;
* a compile that runs past the time limit is a `CompileTimeoutError`
  naming the kernel, the target and the limit; the worker is killed.

The worker runs in its own session (a Ctrl-C at the terminal reaches this
process, which stops the worker only if a compile was under way), ends
when this process closes its stdin or exits, and is not shared with a
forked child (which starts its own).
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .errors import BackendError, CompileTimeoutError

OPTIMIZE_SCRIPT = Path(__file__).with_name("optimize.py")
STDERR_TAIL_CHARS = 4000        # how much of LLVM's last words a crash report quotes
READ_CHUNK_BYTES = 1 << 20
SELECT_SLICE_S = 60.0


class Worker:
    """One `optimize.py --serve` child process (or another `script` speaking its protocol) and the pipes to it;
    restarted when it dies."""

    def __init__(self, script: Path = OPTIMIZE_SCRIPT):
        self.script = script
        self._process: subprocess.Popen | None = None
        self._stderr = None         # a temp file the child writes its stderr to (a pipe could fill and block it)
        self._lock = threading.Lock()
        self._served = 0            # requests the running child has answered

    def prepare(self) -> None:
        """Start the child now if it is not running (without waiting for it to be ready)."""
        with self._lock:
            self._ensure_started()

    def compile(self, request: dict, timeout_s: float) -> dict:
        """Send `request`, wait at most `timeout_s` for the reply (the decoded JSON). Raises `_Died` or
        `_TimedOut`; on those, and on any interruption, the child is stopped. A child that had served earlier
        requests and dies on this one gets the request again in a fresh child: it may have died of something
        else (killed between compiles, before this process noticed)."""
        line = encode_request(request)
        with self._lock:
            for attempt in range(2):
                self._ensure_started()
                served_before = self._served
                try:
                    self._send(line)
                    reply = self._receive(time.monotonic() + timeout_s)
                    self._served += 1
                    sys.stderr.write(self.stderr_text())    # LLVM's warnings, as they would be in this process
                    return reply
                except _Died:
                    self.stop(kill=True)
                    if not served_before or attempt:
                        raise
                except BaseException:
                    self.stop(kill=True)
                    raise

    def stop(self, kill: bool = False) -> None:
        """End the child (closing its stdin lets an idle one exit by itself; `kill` does not wait)."""
        process, self._process = self._process, None
        if process is None:
            return
        if kill:
            process.kill()
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs, else None."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def stderr_text(self) -> str:
        """What the child wrote on stderr since the last request began (kept after it stopped)."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    # -- the child process -------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        self.stop()
        if self._stderr is not None:
            self._stderr.close()
        self._stderr = tempfile.TemporaryFile(prefix="tessera-llvm-")
        self._process = subprocess.Popen(
            [sys.executable, "-S", "-P", str(self.script), "--serve"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, env=_child_environment(), start_new_session=True)
        self._served = 0

    def _send(self, line: bytes) -> None:
        self._stderr.seek(0)
        self._stderr.truncate()     # the child shares this file's offset: it now writes from the start
        try:
            self._process.stdin.write(line)
            self._process.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise _Died(self._exit_description()) from None

    def _receive(self, deadline: float) -> dict:
        fd = self._process.stdout.fileno()
        data = bytearray()
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise _TimedOut()
            ready, _, _ = select.select([fd], [], [], min(left, SELECT_SLICE_S))   # (left may be inf)
            if ready:
                chunk = os.read(fd, READ_CHUNK_BYTES)
                if not chunk:
                    raise _Died(self._exit_description())
                data += chunk
        return decode_reply(bytes(data))

    def _exit_description(self) -> str:
        try:
            code = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"


class _Died(Exception):
    """The worker ended while compiling (an abort, a kill): how it ended."""


class _TimedOut(Exception):
    """The worker did not answer in time."""


def encode_request(request: dict) -> bytes:
    return (json.dumps(request) + "\n").encode("utf-8")


def decode_reply(line: bytes) -> dict:
    reply = json.loads(line)
    if reply.get("object") is not None:
        reply["object"] = base64.b64decode(reply["object"])
    return reply


def _child_environment() -> dict:
    """This environment, with llvmlite importable by the child, which starts with `-S` (no site packages to
    set up: 40 ms saved) and `-P` (no script folder on its path, so this folder's `types.py` cannot shadow the
    standard library's)."""
    import llvmlite

    env = dict(os.environ)
    llvmlite_home = str(Path(llvmlite.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [llvmlite_home, env.get("PYTHONPATH")]))
    return env


# -- the process's worker ------------------------------------------------------------------------

_WORKER = Worker()


def prepare() -> None:
    """Start the worker in the background, if it is not running, so it is ready by the time it is needed."""
    _WORKER.prepare()


def compile_in_worker(request: dict, *, timeout_s: float, backend: str, worker: Worker | None = None) -> dict:
    """The worker's reply to `request` (`optimize.compile_llvm`'s arguments): `{"ok": True, ...}` or
    `{"ok": False, "error": ...}` when LLVM rejected the module. Raises BackendError when the worker crashed,
    CompileTimeoutError when it did not answer within `timeout_s`. `worker`: another than the process's."""
    kernel, target = request["kernel"], request["cpu"]
    worker = worker or _WORKER
    try:
        return worker.compile(request, timeout_s)
    except _TimedOut:
        raise CompileTimeoutError(kernel, target, timeout_s) from None
    except _Died as died:
        said = worker.stderr_text().strip()[-STDERR_TAIL_CHARS:] or "(nothing)"
        raise BackendError(f"LLVM crashed ({died}) compiling kernel '{kernel}' for {target} in the compile "
                           f"worker process; this process is unharmed. This is a bug in the {backend} backend's "
                           f"validation: please report it with the thread IR. LLVM said:\n{said}") from None


def current() -> Worker:
    """This process's worker."""
    return _WORKER


def stop() -> None:
    """End the worker (the next compile starts a new one)."""
    _WORKER.stop()


def _forget_after_fork() -> None:
    """In a forked child: the worker and its pipes belong to the parent; this process starts its own."""
    global _WORKER
    _WORKER = Worker()


def _at_exit() -> None:
    """End the worker and close the file its stderr went to (no ResourceWarning for it at shutdown)."""
    _WORKER.stop()
    if _WORKER._stderr is not None:
        _WORKER._stderr.close()
        _WORKER._stderr = None


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(_at_exit)
