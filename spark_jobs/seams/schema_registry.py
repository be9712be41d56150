"""The Schema Registry seam: the only place that talks to a registry (confluent-kafka's client).

Which registry a pipeline uses, first match wins: ``kafka.schema_registry`` of the pipeline file
(``url`` and client settings: ``basic.auth.user.info``, TLS files), ``$LAKE_SCHEMA_REGISTRY_URL``,
the lake root's embedded registry (``lake registry start``). Any Confluent-compatible registry
works: Confluent's, Apicurio's ``/apis/ccompat/v7``, Karapace, Redpanda. A ``mock://`` URL is an
in-process registry (the pipeline test driver's: schemas from files, no server).

:class:`Registry` asks it what the formats need: a schema by id (cached: an id's schema never
changes), a subject's versions and its latest (the reader schema: fetched once per command or job
start), which subjects use an id, and registering a schema under a subject (the registry's
compatibility rules decide). A registry that cannot be reached or refuses the credentials is one
line naming its URL (exit 2): :meth:`Registry.check` asks it once before a command's work starts.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_jobs.config import PipelineConfig, RegistrySpec
from spark_jobs.errors import UserError
from spark_jobs.layout import Layout
from spark_jobs.seams.processes import read_state
from spark_jobs.seams.storage import Root

ENV_URL = "LAKE_SCHEMA_REGISTRY_URL"
# every request waits at most this long for an answer (kafka.schema_registry.timeout), and is tried
# RETRIES more times when it gets none: a registry that accepts connections and never answers is an
# error after about 16 s, not a command that waits for ever
DEFAULT_TIMEOUT = 5.0
RETRIES = 2


@dataclass(frozen=True)
class Version:
    """One registered schema: its id, its subject's version number, its ``schemaType`` (``AVRO``,
    ``PROTOBUF``, ``JSON``) and its text."""

    schema_id: int
    subject: str
    version: int
    schema_type: str  # the registry's word for its format: AVRO, PROTOBUF, JSON
    text: str
    references: tuple = ()


class Registry:
    """One pipeline's Schema Registry (see the module doc)."""

    def __init__(self, spec: RegistrySpec, where: str):
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url, self.where, self.settings = spec.url, where, spec.settings
        conf: dict[str, Any] = {
            "url": spec.url,
            "max.retries": RETRIES,
            "retries.wait.ms": 500,
            **spec.settings,
        }
        try:
            conf["timeout"] = self.timeout = float(conf.get("timeout", DEFAULT_TIMEOUT))
            self.client = SchemaRegistryClient.new_client(conf)
        except (ValueError, TypeError) as exc:
            raise UserError(f"the Schema Registry settings of {where} are not usable: {exc}") from None
        self._by_id: dict[int, Any] = {}
        self._latest: dict[str, Version] = {}

    @property
    def is_mock(self) -> bool:
        return self.url.startswith("mock://")

    @property
    def for_executors(self) -> str:
        """What the executors' decoders ask the registry with about a schema id the driver did not
        know (``lake.formats.RegistryLookup``), as JSON: the first URL, the Authorization header of
        the basic or bearer credentials, the TLS files' contents (the executors share no disk with
        the driver; a client key as PKCS#8), the timeout and the retries. Empty: an in-process
        registry, none to ask. The credentials travel to the executors inside the job's tasks, as
        Spark's own settings do (``spark.network.crypto.enabled`` encrypts that on a cluster)."""
        import json
        from urllib.parse import unquote, urlsplit, urlunsplit

        if self.is_mock:
            return ""
        first = urlsplit(self.url.split(",")[0].strip())
        user = self.settings.get("basic.auth.user.info")
        if first.username is not None:  # basic.auth.credentials.source URL: user:password@host
            if self.settings.get("basic.auth.credentials.source", "USER_INFO").upper() == "URL" or not user:
                user = f"{unquote(first.username)}:{unquote(first.password or '')}"
            first = first._replace(netloc=first.netloc.rsplit("@", 1)[1])
        token = self.settings.get("bearer.auth.token")
        basic = f"Basic {base64.b64encode(user.encode()).decode()}" if user else ""
        settings: dict[str, Any] = {
            "url": urlunsplit(first),
            "authorization": basic or (f"Bearer {token}" if token else ""),
            "timeout": self.timeout,
            "retries": RETRIES,
        }
        for name, key in (("ssl.ca.location", "ca"), ("ssl.certificate.location", "certificate")):
            if name in self.settings:
                settings[key] = self._file(name).decode("ascii", "replace")
        if "ssl.key.location" in self.settings:
            settings["key"] = self._pkcs8(self._file("ssl.key.location"))
        return json.dumps(settings)

    def _file(self, name: str) -> bytes:
        path = self.settings[name]
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise UserError(
                f"kafka.schema_registry.{name} of {self.where}: cannot read {path}: {exc.strerror}"
            ) from None

    def _pkcs8(self, pem: bytes) -> str:
        """A PEM private key (PKCS#1, SEC1 or PKCS#8, encrypted with ``ssl.key.password`` or not) as
        unencrypted PKCS#8 PEM, the form Java reads."""
        from cryptography.hazmat.primitives import serialization

        password = self.settings.get("ssl.key.password")
        try:
            key = serialization.load_pem_private_key(pem, password.encode() if password else None)
        except (ValueError, TypeError) as exc:
            raise UserError(
                f"kafka.schema_registry.ssl.key.location of {self.where}: not a PEM private key this "
                f"product can read ({str(exc).splitlines()[0]})"
            ) from None
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode("ascii")

    def error(self, doing: str, exc: BaseException) -> UserError:
        """One line naming the registry's URL, what was being done and why it failed."""
        timed_out = isinstance(exc, TimeoutError) or any(
            kind.__name__ == "TimeoutException" for kind in type(exc).__mro__
        )  # the client's HTTP library's (httpx's, under the name the client's release imports it by)
        why = (
            f"no answer within {self.timeout:g} s ({RETRIES + 1} attempts; kafka.schema_registry.timeout "
            "sets the wait)"
            if timed_out
            else _why(exc)
        )
        return UserError(f"Schema Registry at {self.url} ({self.where}): {doing}: {why}")

    def _call(self, doing: str, call, *args, **kwargs):
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return call(*args, **kwargs)
        except SchemaRegistryError:
            raise
        except Exception as exc:  # unreachable, TLS, a proxy's page: the registry did not answer
            raise self.error(doing, exc) from None

    def check(self) -> None:
        """Ask the registry once (its subjects): a one-line error when it cannot be reached or refuses
        the credentials, before any work starts."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            self._call("cannot list its subjects", self.client.get_subjects)
        except SchemaRegistryError as exc:
            raise self.error("refused the request", exc) from None

    def schema(self, schema_id: int) -> Version | None:
        """The schema registered under ``schema_id`` (None: the registry has no such id)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if schema_id not in self._by_id:
            try:
                schema = self._call(f"cannot read schema id {schema_id}", self.client.get_schema, schema_id)
            except SchemaRegistryError as exc:
                if exc.http_status_code == 404:
                    return None
                raise self.error(f"cannot read schema id {schema_id}", exc) from None
            self._by_id[schema_id] = schema
        schema = self._by_id[schema_id]
        return Version(schema_id, "", 0, schema.schema_type or "AVRO", schema.schema_str)

    def subjects_of(self, schema_id: int) -> list[str]:
        """The subjects that have ``schema_id`` among their versions."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if self.is_mock:  # the in-process registry answers subject by subject
            subjects = self.client.get_subjects()
            return sorted(s for s in subjects if schema_id in {v.schema_id for v in self.versions(s)})
        try:  # /schemas/ids/{id}/versions: Confluent's and Apicurio's (Apicurio 2 lacks .../subjects)
            found = self._call("cannot look up a schema id", self.client.get_schema_versions, schema_id)
            return sorted({v.subject for v in found})
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return []
            raise self.error(f"cannot look up the subjects of schema id {schema_id}", exc) from None

    def versions(self, subject: str) -> list[Version]:
        """Every version of ``subject``, oldest first (empty: no such subject)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            numbers = self._call(f"cannot list the versions of {subject}", self.client.get_versions, subject)
            found = [
                self._call(f"cannot read {subject} version {n}", self.client.get_version, subject, n)
                for n in numbers
            ]
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return []
            raise self.error(f"cannot read the versions of subject {subject}", exc) from None
        out = []
        for registered in found:
            schema = registered.schema
            self._by_id.setdefault(registered.schema_id, schema)
            schema_type = schema.schema_type or "AVRO"  # the registry omits the type of an Avro schema
            out.append(
                Version(registered.schema_id, subject, registered.version, schema_type, schema.schema_str)
            )
        return out

    def latest(self, subject: str) -> Version | None:
        """The subject's latest version as this process first saw it (None: no such subject): a
        command's or job's reader schema stays the one it started with."""
        if subject not in self._latest:
            found = self.versions(subject)
            if not found:
                return None
            self._latest[subject] = found[-1]
        return self._latest[subject]

    def register(self, subject: str, schema_type: str, text: str) -> int:
        """Register ``text`` under ``subject`` (the registry's compatibility rules decide); returns
        its id. A refusal is one line with the subject and the registry's reason."""
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            schema_id = self._call(
                f"cannot register a schema under {subject}",
                self.client.register_schema,
                subject,
                Schema(text, schema_type),
            )
        except SchemaRegistryError as exc:
            raise UserError(
                f"the Schema Registry at {self.url} refused the {schema_type} schema for subject {subject}: "
                f"{exc.error_message} (HTTP {exc.http_status_code})"
            ) from None
        self._latest.pop(subject, None)
        return int(schema_id)


def connect_registry(config: PipelineConfig, root: Root | Path) -> Registry:
    """The registry the pipeline uses (see the module doc); a one-line error when there is none."""
    if config.kafka.schema_registry is not None:
        return Registry(config.kafka.schema_registry, config.source)
    env = os.environ.get(ENV_URL)
    if env:
        return Registry(RegistrySpec(env), f"${ENV_URL}")
    embedded = read_state(Layout(root).registry_state)  # the lake root's (spark_jobs.seams.embedded_registry)
    if embedded is not None and embedded.get("url"):
        return Registry(RegistrySpec(embedded["url"]), f"embedded registry of {root}")
    raise UserError(
        f"no Schema Registry: {config.source} names no kafka.schema_registry.url, ${ENV_URL} is not set, "
        f"and the embedded registry of {root} is not running; start it with 'lake registry start'"
    )


def _why(exc: BaseException) -> str:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(exc, SchemaRegistryError):
        if exc.http_status_code in (401, 403):
            return f"the credentials were refused (HTTP {exc.http_status_code}: {exc.error_message})"
        return f"HTTP {exc.http_status_code}: {exc.error_message}"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
