"""Leases: one holder at a time of a name among every machine that works on a lake root on an object
store (``<root>/_leases/<name>.json``).

A lock file (``Lake.lock``, the job registry) orders the processes of one machine only. On a shared
root a second machine could run the same join, or refresh a lookup table a backfill refreshes (Delta's
log store keeps each commit, ``lake.delta.PutIfAbsentLogStore``, but not the work from running twice
or a streaming checkpoint from two writers). A lease is an object created only if
it is not there (``If-None-Match: *``) and renewed only if nobody replaced it (``If-Match``), so of
two machines exactly one gets it. Its holder renews it every ``TTL / 3`` seconds from a thread, each
renewal bounded to about 13 s (``seams.storage``: timeouts and attempts).

A lease lapses ``TTL`` seconds after its last renewal **on the store's clock**: a taker reads the
object's age from the store's answer (its ``Date`` less the object's ``Last-Modified``), so no
machine's clock is trusted. Its holder counts from the moment it *sent* its last successful renewal
(which the store cannot have written earlier) on its own monotonic clock, and stops writing ``MARGIN``
seconds before ``TTL`` has passed: every Delta commit of the process under the root is refused from
then on (``seams.fences``, in the log store itself), a job is told to stop, and a lock holder's work
fails at its next commit rather than finishing. ``MARGIN`` covers the store's times being whole
seconds and a commit already on its way when the fence closes.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from spark_jobs.errors import UserError
from spark_jobs.layout import Layout
from spark_jobs.seams import fences
from spark_jobs.seams.storage import ObjectPath, Root, delete_if, put_if, read_tagged

TTL = 60.0  # seconds a lease outlives its last renewal (on the store's clock)
MARGIN = 10.0  # seconds before that its holder stops writing


@dataclass
class Holder:
    """Who holds a lease: host, pid, what for and since when."""

    host: str
    pid: int
    what: str
    since: str

    def says(self) -> str:
        return f"{self.host} (pid {self.pid}, since {self.since})"


def lease_path(root: Root, name: str) -> ObjectPath:
    return Layout(root).lease(name)


def _body(what: str, since: str) -> bytes:
    me = {"host": socket.gethostname(), "pid": os.getpid(), "what": what, "since": since}
    return json.dumps({**me, "renewed_at": datetime.now(UTC).isoformat()}).encode()


def holder(root: Root, name: str) -> Holder | None:
    """Who holds the lease now (None: nobody, or a holder whose lease ran out)."""
    found = read_tagged(_settings(root), lease_path(root, name))
    if found is None or found.age > TTL:
        return None
    return _holder(found.data)


def _holder(data: bytes) -> Holder | None:
    try:
        info = json.loads(data)
        return Holder(info["host"], int(info["pid"]), info["what"], info["since"])
    except (ValueError, KeyError, TypeError):
        return None  # not a lease this product wrote: taken over like a lapsed one


def _settings(root: Root) -> Any:
    assert root.s3 is not None, "leases are for a root on an object store"
    return root.s3


class Lease:
    """A lease this process holds; a thread renews it until :meth:`release`. ``on_lost`` is called
    once (from that thread) when the lease may no longer be this process's: a renewal found it taken,
    or none succeeded in time (the process's commits under the root are refused from then on)."""

    def __init__(
        self,
        root: Root,
        name: str,
        what: str,
        etag: str,
        since: str,
        on_lost: Callable[[str], None],
        sent: float,
    ):
        self.root, self.name, self.what, self.etag, self.since = root, name, what, etag, since
        self.path, self.on_lost = lease_path(root, name), on_lost
        self._good_until(sent)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renewing, name=f"lease-{name}", daemon=True)
        self._thread.start()

    def _good_until(self, sent: float) -> None:
        """The last renewal was sent at ``sent`` (``time.monotonic()``): writes stop MARGIN before TTL."""
        self.until = sent + TTL - MARGIN
        fences.hold(str(self.root), self.name, self.until)

    def valid(self) -> bool:
        """Whether this process may still write under the lease."""
        return time.monotonic() < self.until

    def _renewing(self) -> None:
        while not self._stop.wait(max(0.0, min(TTL / 3, self.until - time.monotonic()))):
            if not self.valid():
                self.on_lost(
                    f"lost the lease {self.path} ({self.what}): the store did not answer its renewals for "
                    f"{TTL - MARGIN:.0f} s, and another machine may take it {MARGIN:.0f} s later; "
                    "this process's commits under the root are refused"
                )
                return
            sent = time.monotonic()
            try:
                etag = put_if(_settings(self.root), self.path, _body(self.what, self.since), self.etag)
            except OSError:
                continue  # the store did not answer: again, until the lease is no longer good
            if etag is None:
                etag = self._own_renewal()
            if etag is None:
                self.until = time.monotonic()  # not ours any more: nothing more is written
                fences.hold(str(self.root), self.name, self.until)
                self.on_lost(
                    f"lost the lease {self.path} ({self.what}): not renewed within {TTL:.0f} s, taken over"
                )
                return
            self.etag = etag
            self._good_until(sent)

    def _own_renewal(self) -> str | None:
        """The lease's ETag when the refused renewal met this holder's own earlier write (a renewal
        the store made but whose answer was lost, then retried against the ETag before it)."""
        try:
            found = read_tagged(_settings(self.root), self.path)
        except OSError:
            return None
        if found is None:
            return None
        try:
            info = json.loads(found.data)
        except ValueError:
            return None
        mine = {"host": socket.gethostname(), "pid": os.getpid(), "since": self.since}
        return found.etag if all(info.get(k) == v for k, v in mine.items()) else None

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        if not self.valid():
            return  # lost: the fence stays closed, and the lease is somebody else's (or lapses)
        fences.lift(str(self.root), self.name)
        try:
            delete_if(_settings(self.root), self.path, self.etag)
        except OSError:
            pass  # it lapses TTL seconds after its last renewal


def acquire(root: Root, name: str, what: str, on_lost: Callable[[str], None]) -> Lease | Holder:
    """Take the lease ``name`` for ``what`` (e.g. "join orders"): the held :class:`Lease`, or the
    :class:`Holder` that has it. A lapsed lease is taken over; of two takers one wins."""
    settings, path = _settings(root), lease_path(root, name)
    since = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        sent = time.monotonic()
        etag = put_if(settings, path, _body(what, since))
        while etag is None:
            found = read_tagged(settings, path)
            sent = time.monotonic()
            if found is None:  # released in between: try to create it again
                etag = put_if(settings, path, _body(what, since))
                continue
            held = _holder(found.data)
            if held is not None and found.age <= TTL:
                return held
            etag = put_if(settings, path, _body(what, since), found.etag)  # lapsed: take it over
            if etag is None:
                continue  # somebody else took it over first: who?
    except OSError as e:
        raise UserError(f"lake root {root}: cannot take the lease {path}: {e}") from None
    return Lease(root, name, what, etag, since, on_lost, sent)


@contextmanager
def leased(
    root: Root, name: str, what: str, *, wait: bool, log: Callable[[str], None] | None = None
) -> Iterator[Lease | None]:
    """Hold the lease ``name`` while the block runs: waiting for its holder (saying so through
    ``log``), or with ``wait=False`` yielding None at once when another holds it."""

    def lost(message: str) -> None:
        if log:
            log(f"WARNING: {message}")

    said = False
    while True:
        got = acquire(root, name, what, lost)
        if isinstance(got, Lease):
            break
        if not wait:
            yield None
            return
        if log and not said:
            log(f"waiting for {got.says()} to finish {got.what} ...")
            said = True
        time.sleep(1.0)
    try:
        yield got
    finally:
        got.release()
