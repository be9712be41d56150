"""What the product's background services (the embedded broker, the Spark Connect server) share:
is a pid alive, is a loopback port free, a free port, waiting for a started service to answer, its
state file, stopping it, the tail of its log."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark_jobs.errors import UserError

HOST = "127.0.0.1"


def alive(pid: int) -> bool:
    """True while process ``pid`` runs: it exists (perhaps under another user) and is not a zombie
    (exited, not yet reaped by its parent: a killed job's pid stays until then)."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # it exists; another user's
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


def check_port(port: int, flag: str, what: str = "port") -> None:
    """A port a service is about to listen on must be a TCP port and free on loopback; else one line
    naming the option (``flag``) that moves it."""
    if not 0 < port < 65536:
        raise UserError(f"{what} {port} is not a TCP port (1..65535)")
    if not port_free(port):
        raise UserError(
            f"{what} {port} on {HOST} is already taken by another process; choose another with {flag}"
        )


def spawn(command: Sequence[str], log: Path, cwd: Path) -> subprocess.Popen:
    """Start a service's process in a session of its own (it outlives the command that started it),
    its output appended to ``log`` after a line with the time of the start."""
    with open(log, "a") as out:
        out.write(f"\n== {datetime.now(UTC).isoformat(timespec='seconds')} start\n")
        out.flush()
        return subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
        )


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


def await_answer(
    proc: subprocess.Popen,
    answers: Callable[[], bool],
    what: str,
    where: str,
    logs: Sequence[Path],
    timeout: float,
) -> None:
    """Wait until a just-started service ``answers()``; a one-line error naming ``what`` (with the last
    line of the first of its ``logs`` that has any, and naming the first) when it exits first or
    stays silent for ``timeout`` seconds (then killed)."""
    log = logs[0]
    deadline = time.monotonic() + timeout
    while not answers():
        if proc.poll() is not None:
            said = next((text for text in map(tail, logs) if text), "")
            raise UserError(
                f"{what} exited during start-up (code {proc.returncode}): {last_line(said)} (log {log})"
            )
        if time.monotonic() > deadline:
            proc.kill()
            raise UserError(f"{what} did not answer on {where} within {timeout:g} s (log {log})")
        time.sleep(0.25)


def read_state(path: Path) -> dict[str, Any] | None:
    """A running process's state file (a service's, a job's registry entry); None when there is none,
    it does not parse, it names no pid, or the process it names is gone (a file left by a dead one:
    exited, killed, a zombie until its parent reaps it, or never started)."""
    try:
        info = json.loads(path.read_text())
        pid = int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if pid > 0 and alive(pid) else None


def write_state(path: Path, info: dict[str, Any], private: bool = False) -> None:
    """A running service's state file (pid, address, log), replaced atomically; ``private``: readable
    by its owner only (it holds a secret)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(info))
    tmp.replace(path)


def stop_service(state: Path, what: str, timeout: float, log: Callable[[str], None]) -> bool:
    """Stop the service whose state file is ``state`` (``terminate``), then remove the file; False when
    it was not running (a file a dead service left behind is removed too)."""
    info = read_state(state)
    if info is None:
        state.unlink(missing_ok=True)
        return False
    log(f"stopping {what} (pid {info['pid']}) ...")
    terminate(int(info["pid"]), timeout)
    state.unlink(missing_ok=True)
    return True


def terminate(pid: int, timeout: float) -> None:
    """SIGTERM (the service's own clean shutdown), SIGKILL after ``timeout`` seconds; reaped."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    reap(pid)
