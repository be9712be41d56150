"""What the product's background services (the embedded broker, the Spark Connect server) share:
is a pid alive, is a loopback port free, a free port, reaping a child, the tail of a log."""

from __future__ import annotations

import os
import socket
from pathlib import Path

HOST = "127.0.0.1"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def last_line(text: str) -> str:
    """The last error-looking line of a log (else its last line)."""
    interesting = [ln for ln in text.splitlines() if "ERROR" in ln or "Exception" in ln] or text.splitlines()
    return interesting[-1].strip() if interesting else "no output"
