"""Where the lake lives: its root, a local folder or an object store's URI, and this machine's work
folder. The one seam to the lake's file system outside Spark.

A root is what ``--root`` or ``LAKE_ROOT`` names (``./lakehouse`` by default). A path without a
scheme (or a ``file://`` URI) is a local folder; ``s3a://bucket/prefix`` is a prefix in an S3 bucket
(AWS S3 or any S3-compatible store: ``lake s3 start`` runs one on loopback). Everything durable lives
under the root (Delta tables, checkpoints, lookup positions, the quality reports, the DAG runs'
hand-offs), written by Spark through Hadoop's S3A connector and by the product itself through
:class:`ObjectPath`. The work folder holds what belongs to one machine: the embedded services'
files, the jobs' pid and lock files, logs, the Spark catalog's Derby database. For a local root it
is the root itself; for a URI root ``LAKE_WORK``, else ``~/.local/state/lake/<root as a name>``, the
same folder for every command on this machine whatever its working directory.

Where the S3 store is and who the lake is to it, in this order:

- the endpoint: ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL`` (as the AWS tools read them), else
  the embedded store when it runs for this root (``lake s3 start``), else AWS's own endpoints; a
  custom endpoint implies path-style requests;
- the region: ``AWS_REGION``, else ``AWS_DEFAULT_REGION``, else ``us-east-1``;
- the credentials: the embedded store's key when it is the endpoint, else the standard chains (the
  ``AWS_*`` variables, a profile, an instance or container role): Spark's S3A connector and the
  product's own reads and writes each ask them, so no secret is written into a setting or the lake.

Hadoop's own settings (``spark.hadoop.fs.s3a.*`` in ``spark-defaults.conf``, ``core-site.xml``) still
apply to Spark beside these.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from spark_jobs.errors import UserError

DEFAULT_ROOT = "lakehouse"
OBJECT_SCHEMES = ("s3a",)
PUT_IF_ABSENT_LOG_STORE = "lake.delta.PutIfAbsentLogStore"  # (spark_jobs/seams/java/lake/delta)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")


# --- the root ------------------------------------------------------------------------------------
def scheme_of(root: str) -> str | None:
    """The URI scheme of ``root`` (lower case), None for a plain path."""
    found = _SCHEME.match(root)
    return found.group(1).lower() if found else None


def root_text(root: str | os.PathLike[str] | None = None) -> str:
    """``--root`` wins, then ``LAKE_ROOT``, then ``./lakehouse``: as given."""
    return os.fspath(root or os.environ.get("LAKE_ROOT") or DEFAULT_ROOT)


@dataclass(frozen=True)
class S3Settings:
    """Where an S3 store is and the key to give it (None: the standard chains)."""

    endpoint: str | None
    region: str
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)

    @property
    def names(self) -> str:
        return self.endpoint or f"AWS S3 ({self.region})"


@dataclass(frozen=True)
class Root:
    """A lake root: ``path`` (a local :class:`Path` or an :class:`ObjectPath`), ``work`` (this
    machine's folder for it) and ``s3`` (an object store's settings)."""

    path: Any
    work: Path
    s3: S3Settings | None = None

    @classmethod
    def local(cls, path: Path) -> Root:
        path = Path(path).absolute()
        return cls(path, path)

    @property
    def on_object_storage(self) -> bool:
        return isinstance(self.path, ObjectPath)

    def __str__(self) -> str:
        return str(self.path)


def resolve_root(root: str | os.PathLike[str] | Root | None = None) -> Root:
    """The lake root ``--root``/``LAKE_ROOT`` names (no request is made: :func:`check_root` asks an
    object store). A root on a file system the product cannot reach is refused in one line, never
    taken for a local folder named after its URI."""
    if isinstance(root, Root):
        return root
    return _resolve(root_text(root))


@cache
def _resolve(text: str) -> Root:
    scheme = scheme_of(text)
    if scheme is None:
        return Root.local(Path(text))
    if scheme == "file":
        return Root.local(Path(text[len("file://") :]))
    if scheme not in OBJECT_SCHEMES:
        hint = " (Hadoop's S3A connector: s3a://)" if scheme == "s3" else ""
        raise UserError(
            f"lake root {text}: no file system for {scheme}:// here{hint}; "
            f"a lake root is a local folder or s3a://bucket/prefix"
        )
    bucket, _, prefix = text[len(scheme) + 3 :].partition("/")
    if not bucket:
        raise UserError(f"lake root {text}: names no bucket (s3a://bucket/prefix)")
    work = work_folder(text)
    settings = s3_settings(work)
    path = ObjectPath(_s3_filesystem(settings), scheme, f"{bucket}/{prefix.strip('/')}".rstrip("/"))
    return Root(path, work, settings)


def location(text: str) -> Any:
    """A file or folder named by a path or a URI: a local :class:`Path`, or an :class:`ObjectPath` on
    the store the URI names (reached with the settings a root there would use)."""
    scheme = scheme_of(text)
    if scheme is None:
        return Path(text).absolute()
    return _resolve(text).path


def bucket_of(root: str | os.PathLike[str] | None = None) -> str | None:
    """The bucket of an object store's root, None for a local root."""
    path = resolve_root(root).path
    return path.bucket if isinstance(path, ObjectPath) else None


def work_folder(root: str | os.PathLike[str] | None = None) -> Path:
    """The machine-local work folder of the lake at ``root`` (see the module's text)."""
    text = root_text(root)
    scheme = scheme_of(text)
    if scheme is None:
        return Path(text).absolute()
    if scheme == "file":
        return Path(text[len("file://") :]).absolute()
    if os.environ.get("LAKE_WORK"):
        return Path(os.environ["LAKE_WORK"]).absolute()
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "lake" / name


# --- the S3 store ---------------------------------------------------------------------------------
def s3_settings(work: Path) -> S3Settings:
    """The store of a root whose work folder is ``work`` (see the module's text)."""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        return S3Settings(endpoint.rstrip("/"), region)
    from spark_jobs.seams import embedded_s3

    store = embedded_s3.S3Store(work).status()
    if store.running:
        return S3Settings(
            store.address, embedded_s3.REGION, store.details["access_key"], store.details["secret_key"]
        )
    return S3Settings(None, region)


def _s3_filesystem(settings: S3Settings) -> Any:
    from pyarrow import fs

    options: dict[str, Any] = {"region": settings.region, "connect_timeout": 5, "request_timeout": 30}
    if settings.endpoint:
        options["endpoint_override"] = settings.endpoint
        options["scheme"] = "https" if settings.endpoint.startswith("https:") else "http"
    if settings.access_key:
        options["access_key"], options["secret_key"] = settings.access_key, settings.secret_key
    return fs.S3FileSystem(**options)


@cache
def check_root(root: Root) -> None:
    """Once per process, one request: the bucket of a root on an object store exists and lets this
    machine list the root, else one line naming the root and what failed. Nothing to ask for a
    local root."""
    from pyarrow import fs

    path, settings = root.path, root.s3
    if not isinstance(path, ObjectPath) or settings is None:
        return
    bucket = path.bucket
    try:
        path.fs.get_file_info(fs.FileSelector(path.key, allow_not_found=False, recursive=False))
    except FileNotFoundError:
        pass  # a new root: nothing under it yet
    except OSError as e:
        said = str(e)
        refused = ("ACCESS_DENIED", "SIGNATURE_DOES_NOT_MATCH", "INVALID_ACCESS_KEY", "HTTP status 403")
        if "NO_SUCH_BUCKET" in said:
            why = f"bucket {bucket} does not exist at {settings.names}"
        elif any(word in said for word in refused):
            why = f"{settings.names} refused this machine's credentials for bucket {bucket}"
        elif "curlCode" in said or "connect" in said.lower() or "resolve" in said.lower():
            why = f"no answer from {settings.names}"
        else:
            why = f"{settings.names} answered: {said.splitlines()[0] if said else type(e).__name__}"
        raise UserError(f"lake root {root}: {why}") from None


def hadoop_conf(root: Root) -> dict[str, str]:
    """Spark's settings for the root's file system (none for a local root): the S3A connector told
    the endpoint and region, and the embedded store's key, which Spark redacts in its UI and logs."""
    if root.s3 is None:
        return {}
    s3 = root.s3
    conf = {
        # Delta's log on S3 through a store that creates each commit file only if it is absent
        # (spark_jobs/seams/java/lake/delta): two drivers committing one version get one success and
        # one conflict, which Delta retries or refuses, instead of the later commit replacing the first
        "spark.delta.logStore.s3a.impl": PUT_IF_ABSENT_LOG_STORE,
        "spark.hadoop.fs.s3a.endpoint.region": s3.region,
        # a file copied up (RocksDB's state checkpoints) goes through the S3 client every other write
        # uses: the "optimized" copy takes the SDK's asynchronous client, whose Netty transport the
        # slim SDK set leaves out (netty-nio-client; without this setting every state commit fails)
        "spark.hadoop.fs.s3a.optimized.copy.from.local.enabled": "false",
    }
    if s3.endpoint:
        conf.update(
            {
                "spark.hadoop.fs.s3a.endpoint": s3.endpoint,
                "spark.hadoop.fs.s3a.path.style.access": "true",
                "spark.hadoop.fs.s3a.connection.ssl.enabled": str(s3.endpoint.startswith("https:")).lower(),
            }
        )
    if s3.access_key:
        conf.update(
            {
                "spark.hadoop.fs.s3a.access.key": s3.access_key,
                "spark.hadoop.fs.s3a.secret.key": str(s3.secret_key),
                "spark.hadoop.fs.s3a.aws.credentials.provider": (
                    "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
                ),
            }
        )
    return conf


# --- paths on an object store ---------------------------------------------------------------------
class ObjectPath:
    """A key (or a prefix: a "folder") in a bucket, with the part of ``pathlib.Path``'s interface the
    product uses on the lake root. Folders do not exist on an object store: one exists while a key is
    under it, ``mkdir`` does nothing, and removing its last key removes it. A write is one PUT, whole
    or not at all; there is no appending and no rename."""

    def __init__(self, filesystem: Any, scheme: str, key: str):
        self.fs, self.scheme, self.key = filesystem, scheme, key.strip("/")

    # naming
    def __str__(self) -> str:
        return f"{self.scheme}://{self.key}"

    def __repr__(self) -> str:
        return f"ObjectPath({self})"

    def __fspath__(self) -> str:
        raise TypeError(f"{self} is on object storage, not a local file")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and (self.scheme, self.key) == (other.scheme, other.key)

    def __hash__(self) -> int:
        return hash((self.scheme, self.key))

    def __lt__(self, other: ObjectPath) -> bool:
        return self.key < other.key

    def __truediv__(self, part: str | os.PathLike[str]) -> ObjectPath:
        return ObjectPath(self.fs, self.scheme, posixpath.join(self.key, os.fspath(part)))

    def joinpath(self, *parts: str) -> ObjectPath:
        out = self
        for part in parts:
            out = out / part
        return out

    @property
    def bucket(self) -> str:
        return self.key.partition("/")[0]

    @property
    def name(self) -> str:
        return posixpath.basename(self.key)

    @property
    def stem(self) -> str:
        return PurePosixPath(self.name).stem

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(self.fs, self.scheme, posixpath.dirname(self.key))

    def with_name(self, name: str) -> ObjectPath:
        return self.parent / name

    def with_suffix(self, suffix: str) -> ObjectPath:
        return self.with_name(self.stem + suffix)

    def relative_to(self, other: ObjectPath) -> PurePosixPath:
        return PurePosixPath(self.key).relative_to(other.key)

    # asking
    def _info(self) -> Any:
        return self.fs.get_file_info(self.key)

    def exists(self) -> bool:
        from pyarrow import fs

        return self._info().type != fs.FileType.NotFound or self._has_keys_under()

    def is_file(self) -> bool:
        from pyarrow import fs

        return bool(self._info().type == fs.FileType.File)

    def is_dir(self) -> bool:
        from pyarrow import fs

        return self._info().type == fs.FileType.Directory or self._has_keys_under()

    def _has_keys_under(self) -> bool:
        from pyarrow import fs

        return bool(self.fs.get_file_info(fs.FileSelector(self.key, allow_not_found=True, recursive=False)))

    def iterdir(self) -> Iterator[ObjectPath]:
        from pyarrow import fs

        for info in self.fs.get_file_info(fs.FileSelector(self.key, allow_not_found=True, recursive=False)):
            yield ObjectPath(self.fs, self.scheme, info.path)

    def glob(self, pattern: str) -> Iterator[ObjectPath]:
        """Names of one folder level (``*.html``, ``[0-9]*``)."""
        if "/" in pattern:
            raise ValueError(f"glob pattern {pattern!r}: one folder level only")
        return (path for path in self.iterdir() if fnmatch.fnmatchcase(path.name, pattern))

    def files(self) -> Iterator[ObjectPath]:
        """Every object under this prefix, at any depth (one listing, no request per object)."""
        from pyarrow import fs

        for info in self.fs.get_file_info(fs.FileSelector(self.key, allow_not_found=True, recursive=True)):
            if info.type == fs.FileType.File:
                yield ObjectPath(self.fs, self.scheme, info.path)

    # reading and writing
    def read_bytes(self) -> bytes:
        try:
            with self.fs.open_input_stream(self.key) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            raise FileNotFoundError(2, "No such file", str(self)) from None

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read_bytes().decode(encoding, errors)

    def write_bytes(self, data: bytes) -> int:
        with self.fs.open_output_stream(self.key) as stream:
            stream.write(data)
        return len(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> int:
        return self.write_bytes(text.encode(encoding))

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing: a folder on an object store exists while a key is under it."""

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.delete_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise


# --- what pathlib lacks ---------------------------------------------------------------------------
def remove_tree(path: Any) -> None:
    """Remove a folder and everything under it (nothing when it is not there)."""
    if isinstance(path, ObjectPath):
        try:
            path.fs.delete_dir(path.key)
        except FileNotFoundError:
            pass
    elif Path(path).exists():
        shutil.rmtree(path)


def move_tree(source: Any, target: Any) -> None:
    """Move a folder: a rename on a local disk; on an object store a copy of each file, then the
    source removed (not atomic: a reader may see both for a moment)."""
    if not isinstance(source, ObjectPath):
        source.rename(target)
        return
    for file in source.files():
        source.fs.copy_file(file.key, (target / str(file.relative_to(source))).key)
    remove_tree(source)


def write_whole(path: Any, text: str) -> None:
    """Write a small file so that a reader sees the old text or the new, never a part: a local file
    through a temporary one and a rename, an object in one PUT."""
    if isinstance(path, ObjectPath):
        path.write_text(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def append_line(path: Any, line: str) -> None:
    """Add a line at the end of a small file: appended on a local disk; an object is read and written
    whole again (an object store has no append)."""
    if isinstance(path, ObjectPath):
        before = path.read_text() if path.is_file() else ""
        path.write_text(before + line + "\n")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(line + "\n")


def copy_tree(source: Any, target: Any) -> int:
    """Copy the folder ``source`` to ``target``, each a local folder or an object store's prefix,
    file by file (nothing when ``source`` is not there). Returns the files copied."""
    if isinstance(source, ObjectPath):
        files = list(source.files())
    else:
        files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else []
    for file in files:
        dest = target / file.relative_to(source).as_posix()
        dest.parent.mkdir(parents=True, exist_ok=True)  # nothing to do on an object store
        dest.write_bytes(file.read_bytes())
    return len(files)


# --- conditional writes: what leases are made of ----------------------------------------------------
# pyarrow's S3 client cannot send If-None-Match or If-Match, so these few calls go through boto3 (the
# same endpoint, region and credentials, and the same standard chains when no key is given). Each call
# is bounded: 2 s to connect, 4 s for an answer, 2 attempts (at most about 13 s), so that a lease's
# renewal fits in a third of its life whatever the network does.
CALL_CONNECT_S, CALL_READ_S, CALL_ATTEMPTS = 2, 4, 2


class Tagged(NamedTuple):
    """An object's bytes, its ETag, and its age on the store's own clock (seconds since it was last
    written, from the answer's ``Date`` and the object's ``Last-Modified``: both to the second)."""

    data: bytes
    etag: str
    age: float


@cache
def _s3_client(settings: S3Settings) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=settings.endpoint,
        region_name=settings.region,
        aws_access_key_id=settings.access_key,
        aws_secret_access_key=settings.secret_key,
        config=Config(
            s3={"addressing_style": "path"} if settings.endpoint else {},
            connect_timeout=CALL_CONNECT_S,
            read_timeout=CALL_READ_S,
            retries={"max_attempts": CALL_ATTEMPTS, "mode": "standard"},
        ),
    )


def _call(settings: S3Settings, path: ObjectPath, method: str, **kwargs: Any) -> Any:
    """One request about ``path``; None when its condition failed (412, or 409: a concurrent
    conditional write) or the object is not there (404); other failures as OSError, in one line."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, key = path.key.partition("/")
    try:
        return getattr(_s3_client(settings), method)(Bucket=bucket, Key=key, **kwargs)
    except ClientError as e:
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status in (404, 409, 412) or e.response.get("Error", {}).get("Code") == "NoSuchKey":
            return None
        raise OSError(
            f"{settings.names} answered {status}: {e.response.get('Error', {}).get('Code')}"
        ) from None
    except BotoCoreError as e:
        raise OSError(f"no answer from {settings.names}: {e}") from None


def put_if(settings: S3Settings, path: ObjectPath, data: bytes, match: str | None = None) -> str | None:
    """Write ``path`` only if it is not there (``match`` None), or only if its ETag is ``match``: its
    new ETag, or None when the condition failed (somebody else wrote it first)."""
    condition = {"IfMatch": match} if match else {"IfNoneMatch": "*"}
    answer = _call(settings, path, "put_object", Body=data, **condition)
    return answer["ETag"] if answer else None


def read_tagged(settings: S3Settings, path: ObjectPath) -> Tagged | None:
    """The object's bytes, ETag and age on the store's clock (None: not there)."""
    from email.utils import parsedate_to_datetime

    answer = _call(settings, path, "get_object")
    if not answer:
        return None
    now = parsedate_to_datetime(answer["ResponseMetadata"]["HTTPHeaders"]["date"])
    return Tagged(answer["Body"].read(), answer["ETag"], (now - answer["LastModified"]).total_seconds())


def delete_if(settings: S3Settings, path: ObjectPath, match: str) -> bool:
    """Delete ``path`` only if its ETag is still ``match`` (False: it is not, or it is gone)."""
    return _call(settings, path, "delete_object", IfMatch=match) is not None
