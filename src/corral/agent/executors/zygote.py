"""The zygote: a Python process that has imported a job's heavy modules once and forks a
child per run, so a gang's ranks start without paying ``import torch`` each.

Run by the agent (``warm.py``) with the job's own interpreter, as a file, not as
``-m corral...``: it imports nothing but the standard library, so it works in any
environment the job's Python comes from::

    python -u zygote.py SOCKET MODULE [MODULE ...]

It imports the modules, says ``ready`` on stdout, then serves on the Unix socket
``SOCKET``. A request carries the run's stdout and stderr (file descriptors passed
with ``SCM_RIGHTS``) and a JSON body: the script or module, its arguments, its
environment, working directory and CPUs. The zygote forks; the child becomes a
session leader (its own process group, so the agent's stop reaches everything it
starts), takes the descriptors as 1 and 2 and ``/dev/null`` as 0, replaces its
environment, directory, ``sys.argv`` and ``sys.path[0]`` with the run's, and runs the
script as ``__main__`` through ``runpy``; it then ends through the interpreter's own
exit (non-daemon threads joined, ``atexit`` run, the script's exit code or signal).
The zygote answers the child's pid at once and its exit code (``-N`` for signal N,
as ``subprocess``) when it is reaped. It exits when the agent closes its stdin.

Why ``os.fork`` in a helper of our own rather than ``multiprocessing``'s forkserver:
that forkserver is one per interpreter with one global preload list (we keep one
zygote per preload set and restart it when it dies), its children run a pickled
``Process`` through multiprocessing's own bootstrap and exit path rather than a script
as ``__main__`` with the script's exit status, and it cannot hand a child its own
stdout/stderr or session. What it does well, fork from a single-threaded server,
reap with ``SIGCHLD``, pass descriptors over a Unix socket, is a few lines of stdlib.

The fork happens after the imports and never after CUDA is initialised: a CUDA
context does not survive ``fork`` (the child fails with "Cannot re-initialize CUDA
in forked subprocess"), and each rank must initialise CUDA itself, after its own
``CUDA_VISIBLE_DEVICES`` is in its environment. A preload that initialised CUDA or
left Python threads running (a forked child keeps only the forking thread, and
any lock another thread held stays locked) makes the zygote refuse to start; the
agent then starts its runs cold.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import threading
from typing import Any

HEADER = struct.Struct("!Q")  # the JSON body's length, sent with the descriptors
REFUSED = 3  # the exit code of a zygote that could not preload
REQUEST_TIMEOUT_S = 10.0  # the agent sends a request at once; a stalled one must not block all


def main() -> None:
    """Preload, serve until the agent goes away; in a forked child, run its script."""
    del sys.path[0]  # this file's folder: its neighbours must not shadow the job's modules
    path, modules = sys.argv[1], sys.argv[2:]
    refusal = preload(modules)
    if refusal:
        print(refusal, file=sys.stderr, flush=True)
        raise SystemExit(REFUSED)
    gc.freeze()  # the preloaded objects stay shared with the children: no collection writes them
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print(f"ready {os.getpid()}", flush=True)
    request = serve(listener)
    if request is not None:  # the forked child
        run(request)
        return
    with contextlib.suppress(OSError):  # the agent is gone: leave nothing behind in its place
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


def preload(modules: list[str]) -> str:
    """Import ``modules``; what makes forking unsafe afterwards ("" when nothing does)."""
    for name in modules:
        __import__(name)
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and cuda.is_initialized():
        return "a preloaded module initialised CUDA: a forked child could not use it"
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return f"a preloaded module left Python threads running ({names}): forking is unsafe"
    return ""


def serve(listener: socket.socket) -> dict[str, Any] | None:
    """Fork a child per request and report its exit; returns only in a child (its request)
    or once the agent has closed the zygote's stdin (None)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the selector
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "agent")
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection that asked for it
    while True:
        for key, _ in sel.select():
            if key.data == "agent" and not os.read(sys.stdin.fileno(), 4096):
                return None
            if key.data == "child":
                drain(wake_r)
                reap(waiting)
            if key.data == "accept":
                conn, _ = listener.accept()
                request = receive(conn)
                if request is None:
                    conn.close()
                    continue
                if fork(conn, request, waiting):  # the child: leave the zygote's world
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    sel.close()
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    for other in (listener, conn, *waiting.values()):
                        other.close()
                    return request


def receive(conn: socket.socket) -> dict[str, Any] | None:
    """One request: the header with the descriptors, then the body (None if malformed, or
    not all there within ``REQUEST_TIMEOUT_S``: the zygote serves one request at a time)."""
    fds: list[int] = []
    conn.settimeout(REQUEST_TIMEOUT_S)
    try:
        header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 2)
        if len(header) != HEADER.size or len(fds) != 2:
            raise ValueError("not a request")
        (size,) = HEADER.unpack(header)
        body = bytearray()
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ValueError("cut short")
            body += chunk
        request: dict[str, Any] = json.loads(body)
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        return None
    conn.settimeout(None)
    request["fds"] = fds
    return request


def fork(conn: socket.socket, request: dict[str, Any], waiting: dict[int, socket.socket]) -> bool:
    """Fork the run's child; True in the child. The parent answers with the child's pid once
    the child leads its own session, so a stop sent to its group at once finds it."""
    sync_r, sync_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(sync_r)
        os.setsid()
        os.close(sync_w)
        return True
    os.close(sync_w)
    os.read(sync_r, 1)  # end of file once the child has its session (or died)
    os.close(sync_r)
    for fd in request["fds"]:
        os.close(fd)
    with contextlib.suppress(OSError):  # the agent gave up on it already: still reaped below
        conn.sendall(f"{pid}\n".encode())
    waiting[pid] = conn
    return False


def drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass


def reap(waiting: dict[int, socket.socket]) -> None:
    """Report the exit of every child that ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is None:
            continue
        with contextlib.suppress(OSError):
            conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        conn.close()


def run(request: dict[str, Any]) -> None:
    """In the child: become the run's process, then run its script as ``__main__``."""
    out, err = request["fds"]
    devnull = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((devnull, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if request.get("cpus"):
        os.sched_setaffinity(0, request["cpus"])
    fresh_random_state()
    module: str = request.get("module") or ""
    script: str = request.get("script") or ""
    home = os.getcwd() if module else os.path.dirname(os.path.abspath(script))
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [home, *(p for p in extra if p not in sys.path)]
    sys.argv = [script or module, *request["args"]]
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # the traceback a plain run prints: the script's frames
        tb = exc.__traceback__
        ours = {run.__code__.co_filename, runpy.run_path.__code__.co_filename}
        while tb is not None and tb.tb_frame.f_code.co_filename in ours:
            tb = tb.tb_next
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        raise SystemExit(1) from None


def fresh_random_state() -> None:
    """A forked child would share its random state with every sibling; a fresh interpreter
    seeds from the OS. ``random`` reseeds itself after a fork; numpy's global state does not."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


if __name__ == "__main__":
    main()
