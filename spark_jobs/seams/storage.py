"""Where the lake lives: its root, a local folder or a URI, and the machine's local work folder.

A root is what ``--root`` or ``LAKE_ROOT`` names (``./lakehouse`` by default). A path without a
scheme (or a ``file://`` URI) is a local folder; anything else with a scheme (``s3a://bucket/prefix``)
is a Hadoop file system's URI. The local work folder holds what belongs to one machine: the embedded
services' files, the jobs' pid and lock files, logs. For a local root it is the root itself (the
layout of ``docs/cli.md``); for a URI root ``LAKE_WORK``, else ``~/.local/state/lake/<root as a
name>``, the same folder for every command on this machine whatever its working directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from spark_jobs.errors import UserError

DEFAULT_ROOT = "lakehouse"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")


def scheme_of(root: str) -> str | None:
    """The URI scheme of ``root`` (lower case), None for a plain path."""
    found = _SCHEME.match(root)
    return found.group(1).lower() if found else None


def root_text(root: str | os.PathLike[str] | None = None) -> str:
    """``--root`` wins, then ``LAKE_ROOT``, then ``./lakehouse``: as given."""
    return str(root or os.environ.get("LAKE_ROOT") or DEFAULT_ROOT)


def resolve_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The lake root as a local folder (``file://`` URIs included). A root on another file system is
    refused in one line rather than taken for a local folder named after its URI."""
    text = root_text(root)
    scheme = scheme_of(text)
    if scheme == "file":
        return Path(text[len("file://") :]).absolute()
    if scheme is not None:
        raise UserError(
            f"lake root {text}: this version keeps the lake in a local folder only, not on a {scheme}:// "
            "file system; give a local folder (--root or LAKE_ROOT)"
        )
    return Path(text).absolute()


def work_folder(root: str | os.PathLike[str] | None = None) -> Path:
    """The machine-local work folder of the lake at ``root`` (see the module's text)."""
    text = root_text(root)
    scheme = scheme_of(text)
    if scheme is None or scheme == "file":
        return resolve_root(text)
    if os.environ.get("LAKE_WORK"):
        return Path(os.environ["LAKE_WORK"]).absolute()
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "lake" / name
