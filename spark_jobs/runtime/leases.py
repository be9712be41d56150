"""Leases: one holder at a time of a name among every machine that works on a lake root on an object
store (``<root>/_leases/<name>.json``).

A lock file (``Lake.lock``, the job registry) orders the processes of one machine only. On a shared
root a second machine could run the same join, or refresh a lookup table a backfill refreshes (Delta's
log store keeps each commit, ``lake.delta.PutIfAbsentLogStore``, but not the work from running twice
or a streaming checkpoint from two writers). A lease is an object created only if
it is not there (``If-None-Match: *``) and renewed only if nobody replaced it (``If-Match``), so of
two machines exactly one gets it. Its holder renews it every ``TTL / 3`` seconds from a thread; a
holder that stops renewing (killed, or cut off from the store) loses it ``TTL`` seconds after its
last renewal, and the next taker replaces it, again with ``If-Match``. Machines' clocks are trusted
to agree within seconds (NTP): a lease's end is its holder's clock plus ``TTL``.
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
from spark_jobs.seams.storage import ObjectPath, Root, delete_if, put_if, read_tagged

TTL = 60.0  # seconds a lease outlives its last renewal


@dataclass
class Holder:
    """Who holds a lease: host, pid, since when, and until when unless renewed."""

    host: str
    pid: int
    what: str
    since: str
    until: float

    def says(self) -> str:
        return f"{self.host} (pid {self.pid}, since {self.since})"


def lease_path(root: Root, name: str) -> ObjectPath:
    return Layout(root).lease(name)


def _body(what: str, since: str) -> bytes:
    me = {"host": socket.gethostname(), "pid": os.getpid(), "what": what, "since": since}
    return json.dumps(
        {**me, "until": time.time() + TTL, "renewed_at": datetime.now(UTC).isoformat()}
    ).encode()


def holder(root: Root, name: str) -> Holder | None:
    """Who holds the lease now (None: nobody, or a holder whose lease ran out)."""
    found = read_tagged(_settings(root), lease_path(root, name))
    if found is None:
        return None
    held = _holder(found[0])
    return held if held is not None and held.until > time.time() else None


def _holder(data: bytes) -> Holder | None:
    try:
        info = json.loads(data)
        return Holder(info["host"], int(info["pid"]), info["what"], info["since"], float(info["until"]))
    except (ValueError, KeyError, TypeError):
        return None  # not a lease this product wrote: taken over like a lapsed one


def _settings(root: Root) -> Any:
    assert root.s3 is not None, "leases are for a root on an object store"
    return root.s3


class Lease:
    """A lease this process holds; a thread renews it until :meth:`release`. ``on_lost`` is called
    (from that thread) if a renewal finds it taken by another holder: it lapsed unrenewed."""

    def __init__(
        self, root: Root, name: str, what: str, etag: str, since: str, on_lost: Callable[[str], None]
    ):
        self.root, self.name, self.what, self.etag, self.since = root, name, what, etag, since
        self.path, self.on_lost = lease_path(root, name), on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renewing, name=f"lease-{name}", daemon=True)
        self._thread.start()

    def _renewing(self) -> None:
        while not self._stop.wait(TTL / 3):
            try:
                etag = put_if(_settings(self.root), self.path, _body(self.what, self.since), self.etag)
            except OSError:
                continue  # the store did not answer: try again; the lease lasts TTL from the last renewal
            if etag is None:
                self.on_lost(
                    f"lost the lease {self.path} ({self.what}): not renewed within {TTL:.0f} s, taken over"
                )
                return
            self.etag = etag

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
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
        etag = put_if(settings, path, _body(what, since))
        while etag is None:
            found = read_tagged(settings, path)
            if found is None:  # released in between: try to create it again
                etag = put_if(settings, path, _body(what, since))
                continue
            held = _holder(found[0])
            if held is not None and held.until > time.time():
                return held
            etag = put_if(settings, path, _body(what, since), found[1])  # lapsed: take it over
            if etag is None:
                continue  # somebody else took it over first: who?
    except OSError as e:
        raise UserError(f"lake root {root}: cannot take the lease {path}: {e}") from None
    return Lease(root, name, what, etag, since, on_lost)


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
