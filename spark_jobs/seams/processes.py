"""The product's local services (the embedded broker, Schema Registry and S3 store, the Spark Connect
server) and what they share: one shape, :class:`Service` (a state file while it runs, start, wait
until it answers, status, stop, its log), which ``lake <service> start | stop | status | log`` drives
for each of them alike; and the process helpers under it (is a pid alive, is a loopback port free, a
free port, spawning, stopping).

A service's state file (JSON) holds its pid, its address, when it started, its data folder and its log
while it runs; a file left by a dead process reads as not running. Start does nothing when the service
runs; otherwise it launches it (the service's own part), waits until it answers (a one-line error with
the last line of its log when it exits first or stays silent), then writes the state file. Stop sends
SIGTERM (the service's own clean shutdown), then SIGKILL after the service's timeout, and removes the
file."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

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


def spawn(
    command: Sequence[str], log: Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start a service's process in a session of its own (it outlives the command that started it),
    its output appended to ``log`` after a line with the time of the start; ``env``: variables set
    for it besides this process's."""
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
            env={**os.environ, **env} if env else None,
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


@dataclass(frozen=True)
class ServiceStatus:
    """What ``lake <service> status`` says: running or not, where, since when, its data and log;
    ``details`` the service's own facts (printed by ``--json`` except ``secrets``)."""

    title: str
    running: bool
    address: str | None = None
    pid: int | None = None
    started_at: str | None = None
    data_dir: str | None = None
    log: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    address_key: str = "address"  # the address's name in the state file and in --json
    also: str = ""  # more addresses, said after the first (a broker's SASL listener)
    secrets: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        common = {"running": self.running, self.address_key: self.address, "pid": self.pid}
        common |= {"started_at": self.started_at, "data_dir": self.data_dir, "log": self.log}
        return common | {k: v for k, v in self.details.items() if k not in self.secrets}

    def text(self) -> str:
        if not self.running:
            return f"{self.title}: not running"
        data = f"data {self.data_dir}, " if self.data_dir else ""
        return (
            f"{self.title}: running at {self.address}{self.also} (pid {self.pid}, since {self.started_at}); "
            f"{data}log {self.log}"
        )


class Service:
    """One local service at a lake root (or, for the S3 store, its work folder): the shape every one
    of them has. A service is a subclass that names its files and says how it is launched
    (:meth:`launch`) and how it answers; ``lake <name> ...`` is built from these attributes."""

    name: ClassVar[str]  # the CLI word: lake <name> start | stop | status | log
    title: ClassVar[str]  # "embedded Kafka broker"
    address_key: ClassVar[str]  # what its address is called: bootstrap_servers, url, endpoint
    default_port: ClassVar[int]
    port_env: ClassVar[str]  # the environment variable that moves its default port
    start_timeout: ClassVar[float] = 60.0
    stop_timeout: ClassVar[float] = 30.0
    secrets: ClassVar[tuple[str, ...]] = ()  # state file entries never printed (the file is private)

    def __init__(self, place: Any):
        from spark_jobs.layout import Layout

        self.layout = Layout(place)

    # what a service names
    @property
    def state_file(self) -> Path:
        raise NotImplementedError

    @property
    def log_file(self) -> Path:
        raise NotImplementedError

    def launch(self, port: int, log: Callable[[str], None], **options: Any) -> Launched:
        """Start the process (the service is not running); what to wait for and to record."""
        raise NotImplementedError

    def ready(self, launched: Launched) -> None:
        """After it first answers, before its state is written (a setting, a warm-up)."""

    # the shape they share
    @classmethod
    def port(cls, given: int | None = None) -> int:
        """``given``, else ``$<port_env>``, else the service's default port."""
        return given or int(os.environ.get(cls.port_env, cls.default_port))

    def status(self) -> ServiceStatus:
        info = read_state(self.state_file)
        if info is None:
            return ServiceStatus(self.title, False, address_key=self.address_key, secrets=self.secrets)
        common = {"pid", self.address_key, "started_at", "data_dir", "log"}
        return ServiceStatus(
            self.title,
            True,
            info.get(self.address_key),
            int(info["pid"]),
            info.get("started_at"),
            info.get("data_dir"),
            info.get("log"),
            {k: v for k, v in info.items() if k not in common},
            self.address_key,
            self.describe_also(info),
            self.secrets,
        )

    def describe_also(self, info: dict[str, Any]) -> str:
        return ""

    def start(
        self,
        port: int | None = None,
        log: Callable[[str], None] = lambda _: None,
        flag: str = "--port",
        **options: Any,
    ) -> ServiceStatus:
        """Start it unless it runs; returns once it answers. ``flag``: the option that named ``port``
        (named by the error when the port is taken)."""
        current = self.status()
        if current.running:
            return current
        port = self.port(port)
        check_port(port, flag)
        launched = self.launch(port, log, **options)
        await_answer(
            launched.process,
            launched.answers,
            f"the {self.title}",
            launched.where,
            launched.logs or [self.log_file],
            self.start_timeout,
        )
        self.ready(launched)
        started = datetime.now(UTC).isoformat(timespec="seconds")
        info = {"pid": launched.process.pid, "port": port, "started_at": started, "log": str(self.log_file)}
        write_state(self.state_file, info | launched.state, private=bool(self.secrets))
        return self.status()

    def stop(self, log: Callable[[str], None] = lambda _: None) -> bool:
        """Stop it (SIGTERM, then SIGKILL after its timeout), then remove its state file; False when it
        was not running (a file a dead process left behind is removed too)."""
        info = read_state(self.state_file)
        if info is None:
            self.state_file.unlink(missing_ok=True)
            return False
        log(f"stopping the {self.title} (pid {info['pid']}) ...")
        terminate(int(info["pid"]), self.stop_timeout)
        self.state_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of its log ("" when it has none)."""
        return tail(self.log_file, lines)


@dataclass
class Launched:
    """A service's just-started process: ``answers()`` once it serves at ``where``; ``logs`` to quote
    when it does not (default: its log); ``state`` its own entries of the state file."""

    process: subprocess.Popen
    answers: Callable[[], bool]
    where: str
    state: dict[str, Any]
    logs: list[Path] = field(default_factory=list)
