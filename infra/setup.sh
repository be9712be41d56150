#!/usr/bin/env bash
# One-step, idempotent set-up of everything the product needs on a fresh Debian/Ubuntu machine:
#   - Java 17+ for Spark (installed with apt when missing and we are root; otherwise a clear message),
#   - a pinned uv (in .tools/) to install the locked dependency set quickly,
#   - .venv/ at the repo root with exactly requirements.lock plus this repo (editable).
# Re-running is fast: a stamp of the lock, pyproject and this script skips the sync when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
UV_VERSION=0.13.9
PY=${LAKE_PYTHON:-python3.11}

say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# --- Python 3.11 ---------------------------------------------------------------------------------
if ! command -v "$PY" >/dev/null 2>&1; then
  if command -v python3 >/dev/null 2>&1 && python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    PY=python3
  else
    die "Python 3.11 is required (found: $(python3 --version 2>&1 || echo none)). Install python3.11 and python3.11-venv, or set LAKE_PYTHON."
  fi
fi

# --- Java 17+ (Spark 4) ---------------------------------------------------------------------------
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1; }
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ] 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "Java 17 is missing: installing openjdk-17-jre-headless with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    die "Spark needs Java 17 or newer and none was found. Install it, e.g. 'sudo apt-get install openjdk-17-jre-headless', then rerun."
  fi
fi

# --- Chromium (the report's browser test and README screenshot; nothing else needs it) -----------
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "Chromium is missing: installing Debian's chromium with apt-get (for the report's browser test)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq chromium >/dev/null
  else
    say "warning: no chromium found; the report's browser test will fail until it is installed ('sudo apt-get install chromium')"
  fi
fi

# --- Python environment ---------------------------------------------------------------------------
stamp_src=$(cat requirements.lock pyproject.toml infra/setup.sh | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f .venv/.setup-stamp ] && [ "$(cat .venv/.setup-stamp)" = "$stamp_src" ]; then
  exit 0
fi
if [ ! -x .tools/bin/uv ] || [ "$(.tools/bin/uv --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  say "bootstrapping uv $UV_VERSION into .tools/"
  rm -rf .tools
  "$PY" -m venv .tools
  .tools/bin/pip install -q --disable-pip-version-check "uv==$UV_VERSION"
fi
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version)"
  .tools/bin/uv venv -q --python "$(command -v "$PY")" .venv
fi
say "syncing .venv with requirements.lock"
.tools/bin/uv pip sync -q --compile-bytecode --python .venv/bin/python --require-hashes requirements.lock
.tools/bin/uv pip install -q --python .venv/bin/python --no-deps --config-settings editable_mode=compat -e .
echo "$stamp_src" > .venv/.setup-stamp
say "ready: $ROOT/.venv ($(.venv/bin/python -c 'import pyspark, deltalake; print("pyspark", pyspark.__version__, "deltalake", deltalake.__version__)'))"
