"""The rank process: a long-lived child that runs functions for a
:class:`~attnbench.execution.pool.RankPool`.

It is started by the pool (never imported for its side effects) as::

    python -c "<put attnbench on sys.path>; from attnbench.execution.child import main; ..." CONFIG

where CONFIG is JSON ``{"rank", "world_size", "rfd", "wfd"}``: ``rfd`` is the read end of the
request pipe, ``wfd`` the write end of the reply pipe (both handed over with ``pass_fds``).
stdout and stderr are a log file that the pool reads the tail of; the protocol never touches them,
so prints in user backends cannot corrupt it.

Protocol: every message is one frame, an 8-byte little-endian length then a pickle.

    parent -> child   {"type": "init", "sys_path": [...], "threads": int | None, "preload": [...]}
                      {"type": "call", "id": int, "func": "module:function", "payload": {...}}
                      {"type": "exit"}
    child -> parent   {"type": "ready", "pid", "rank", "startup_s"}
                      {"type": "failed", "traceback"}            (init or preload raised)
                      {"type": "compile", "id", "start": bool}  (mid-call: a backend's compile
                                                                 starts / ends, see
                                                                 attnbench.backends.base.compiling)
                      {"type": "reply", "id", "kind": "ok" | "error" | "oom",
                       "result", "traceback", "summary", "duration_s",
                       "recycle": "" | why the rank wants to be replaced}

This module imports nothing heavy: the pool's parent process (a Dask worker) imports it for the
framing helpers and must never import torch. The child imports torch only when ``threads`` is set
or a called function does, and never initialises CUDA itself.
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import json
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import traceback
from typing import Any, Callable

from attnbench.errors import is_oom

HEADER = struct.Struct("<Q")
"""Frame header: payload length in bytes."""

# Frames up to this size go out in one write() (header and body concatenated); larger ones are
# written header first so a big result is not copied once more.
_SMALL_FRAME = 1 << 16



# -- framing (shared with the parent) ------------------------------------------------------------


def write_frame(fd: int, data: bytes) -> None:
    """Write one frame (length prefix + ``data``) to a blocking fd."""
    header = HEADER.pack(len(data))
    if len(data) <= _SMALL_FRAME:
        _write_all(fd, header + data)
    else:
        _write_all(fd, header)
        _write_all(fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_message(fd: int, message: Any) -> None:
    write_frame(fd, pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _read_exact(fd: int, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int) -> Any:
    """Read one frame from a blocking fd; EOFError when the other end is gone."""
    (length,) = HEADER.unpack(_read_exact(fd, HEADER.size))
    return pickle.loads(_read_exact(fd, length))




def _release_memory() -> None:
    """After an out-of-memory error: drop garbage and hand cached CUDA blocks back, without
    initialising CUDA where it was never used."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


# -- asking to be replaced -----------------------------------------------------------------------

_recycle_reason: str = ""


def recycle_after_call(reason: str) -> None:
    """Ask the pool to replace this rank once the current call has answered, e.g. after a CUDA
    error that poisons the context (an illegal memory access is sticky), which a function that
    turns exceptions into records would otherwise carry into the next case."""
    global _recycle_reason
    _recycle_reason = reason or "requested"


# -- the process ---------------------------------------------------------------------------------


def _exit_when_parent_gone(rfd: int) -> None:
    """Watchdog thread: the request pipe hangs up when the parent dies (even mid-call, when the
    main thread is busy or hung in Python code). Kill our whole process group: no orphans."""
    poller = select.poll()
    poller.register(rfd, 0)  # POLLHUP / POLLERR are always reported
    while True:
        for _fd, events in poller.poll():
            if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                if os.getpgid(0) == os.getpid():  # we lead our own group (start_new_session)
                    os.killpg(os.getpid(), signal.SIGKILL)
                os._exit(1)


def _resolve(ref: str) -> Callable[[Any], Any]:
    # Imported here, at the first call: the parent (a Dask worker) imports this module for its
    # framing helpers only. The registry's package is torch-free.
    from attnbench.backends import load_object

    obj = load_object(ref, "function")
    if not callable(obj):
        raise TypeError(f"{ref!r} is not callable")
    return obj


def _call(functions: dict[str, Callable], message: dict) -> dict:
    """Run one call; every exception that escapes the function becomes an error/oom reply."""
    reply: dict[str, Any] = {"type": "reply", "id": message["id"], "kind": "ok", "result": None,
                             "traceback": "", "summary": ""}
    start = time.perf_counter()
    try:
        func = functions.get(message["func"])
        if func is None:
            func = functions[message["func"]] = _resolve(message["func"])
        reply["result"] = func(message["payload"])
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        reply["kind"] = "oom" if is_oom(exc) else "error"
        reply["traceback"] = traceback.format_exc()
        reply["summary"] = (f"{type(exc).__name__}: {exc}" if str(exc)
                            else type(exc).__name__).splitlines()[0][:500]
        traceback.clear_frames(exc.__traceback__)  # frames may hold large tensors
        del exc
        if reply["kind"] == "oom":
            _release_memory()
    reply["duration_s"] = time.perf_counter() - start
    global _recycle_reason
    reply["recycle"], _recycle_reason = _recycle_reason, ""
    return reply


def _encode(reply: dict) -> bytes:
    try:
        return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # noqa: BLE001 - an unpicklable result is the function's fault
        summary = f"result of {type(reply['result']).__name__} cannot be pickled: {exc}"
        reply.update(kind="error", result=None, summary=summary[:500],
                     traceback=traceback.format_exc())
        return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a user replaced or closed the stream; nothing to report to
            pass


_current_call: dict[str, int] = {}
"""The call running now: {"id", "wfd"} (empty between calls)."""


def _tell_compiling(start: bool) -> None:
    """A backend's compile starts or ends inside the current call: the pool stops (restarts) the
    call's timeout clock. Written from the calling thread, between calls' replies."""
    if _current_call:
        write_message(_current_call["wfd"],
                      {"type": "compile", "id": _current_call["id"], "start": start})


def serve(rfd: int, wfd: int) -> int:
    functions: dict[str, Callable] = {}
    from attnbench.backends.base import on_compile  # torch-free

    on_compile(_tell_compiling)
    while True:
        try:
            message = read_message(rfd)
        except EOFError:
            return 0
        if message["type"] == "exit":
            return 0
        if message["type"] != "call":
            raise ValueError(f"unknown message type {message['type']!r}")
        _current_call.update(id=message["id"], wfd=wfd)
        try:
            reply = _call(functions, message)
        finally:
            _current_call.clear()
        data = _encode(reply)
        _flush_std()
        write_frame(wfd, data)


def main(argv: list[str] | None = None) -> int:
    config = json.loads((sys.argv[1:] if argv is None else argv)[0])
    rfd, wfd = config["rfd"], config["wfd"]
    os.set_inheritable(rfd, False)  # our own children must not keep the pipes open
    os.set_inheritable(wfd, False)
    # Python stacks of every thread on SIGSEGV/SIGABRT/..., and on SIGUSR1 (the pool sends it to
    # a hung rank before killing it), into the log whose tail becomes the record.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    threading.Thread(target=_exit_when_parent_gone, args=(rfd,), name="parent-watchdog",
                     daemon=True).start()
    try:
        init = read_message(rfd)
    except EOFError:
        return 0
    start = time.perf_counter()
    # The parent's import path first (Dask may add upload directories), then anything we had.
    sys.path[:] = list(dict.fromkeys([*init["sys_path"], *sys.path]))
    try:
        if init.get("threads"):
            import torch

            torch.set_num_threads(int(init["threads"]))
        for module in init.get("preload") or ():
            importlib.import_module(module)
    except BaseException:  # noqa: BLE001 - reported to the parent as a start failure
        text = traceback.format_exc()
        sys.stderr.write(text)
        write_message(wfd, {"type": "failed", "traceback": text})
        return 1
    write_message(wfd, {"type": "ready", "pid": os.getpid(), "rank": config["rank"],
                        "startup_s": time.perf_counter() - start})
    return serve(rfd, wfd)
