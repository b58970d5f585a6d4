"""Network namespaces for the bridge tests: ``ip`` and running code inside a namespace."""

from __future__ import annotations

import ctypes
import subprocess
import threading
from collections.abc import Callable
from typing import Any

CLONE_NEWNET = 0x40000000


def ip(*args: str) -> subprocess.CompletedProcess:
    """``ip ARGS`` (iproute2), its output captured."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def in_netns(name: str, fn: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    """Run ``fn`` in a thread that has joined namespace ``name`` and return what it returns
    (sockets it makes stay in the namespace); what it raises is raised here."""
    out: dict = {}

    def run() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(f"/run/netns/{name}") as fh:
                if libc.setns(fh.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            out["value"] = fn()
        except BaseException as e:  # handed to the test thread
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=timeout_s)
    assert not t.is_alive(), f"{fn} did not end within {timeout_s} s"
    if "error" in out:
        raise out["error"]
    return out["value"]
