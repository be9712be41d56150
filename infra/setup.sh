#!/usr/bin/env bash
# One-step, idempotent set-up of everything the product needs on a fresh Debian/Ubuntu machine:
#   - Java 17+ (a JDK: Spark runs on it, javac builds the join operators; installed with apt when
#     missing and we are root; otherwise a clear message),
#   - Maven (with apt when missing and we are root) and the locked JVM jars in .jvm/ (Delta's Spark
#     integration, Spark's Kafka connector and Avro functions, protobuf-java for every Spark session;
#     the KRaft broker; the Schema Registry's archive), each checked against infra/jvm/jars.sha256,
#   - a pinned uv (in .tools/) to install the locked dependency set quickly,
#   - .venv/ at the repo root with exactly requirements.lock plus this repo (editable),
#   - the joins' Java state operators, compiled against that pyspark into build/jvm/lake-joins.jar,
#     the record formats' decoders into build/jvm/formats/lake-formats.jar and the seams' classes (the
#     changelog's writer, the Delta log store of s3a:// roots) into build/jvm/seams/lake-seams.jar.
# Re-running is fast: stamps of the locks, pyproject and this script skip the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
UV_VERSION=0.13.9
PY=${LAKE_PYTHON:-python3.11}

say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
apt_install() {  # package, why: install a Debian package when we are root and have apt; else fail
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "$2: installing $1 with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "$1" >/dev/null
  else
    return 1
  fi
}

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
  apt_install openjdk-17-jdk-headless "Java 17 is missing" \
    || die "Spark needs a Java 17+ JDK and none was found. Install it, e.g. 'sudo apt-get install openjdk-17-jdk-headless', then rerun."
fi

# --- Chromium (the report's browser test and the screenshot in docs/quality.md; nothing else needs it) -----------
if ! command -v chromium >/dev/null 2>&1; then
  apt_install chromium "Chromium is missing (for the report's browser test)" \
    || say "warning: no chromium found; the report's browser test will fail until it is installed ('sudo apt-get install chromium')"
fi

# --- JVM jars (Maven Central, locked by infra/jvm/*.pom.xml + infra/jvm/jars.sha256) -------------
# jar sets: name -> pom (the Kafka Streams peer of the benchmarks keeps its pom beside its sources)
jar_sets="spark:infra/jvm/spark.pom.xml kafka:infra/jvm/kafka.pom.xml registry:infra/jvm/registry.pom.xml s3:infra/jvm/s3.pom.xml streams:tests/bench/peer/pom.xml"
jvm_stamp=$(cat infra/jvm/*.pom.xml tests/bench/peer/pom.xml infra/jvm/jars.sha256 infra/setup.sh | sha256sum | cut -d' ' -f1)
if ! [ -f .jvm/.stamp ] || [ "$(cat .jvm/.stamp)" != "$jvm_stamp" ]; then
  if ! command -v mvn >/dev/null 2>&1; then
    apt_install maven "Maven is missing (it fetches the locked JVM jars)" \
      || die "Maven is needed to fetch the locked JVM jars and none was found. Install it, e.g. 'sudo apt-get install maven', then rerun."
  fi
  say "fetching the locked JVM jars with Maven into .jvm/"
  rm -rf .jvm.tmp && mkdir -p .jvm.tmp
  for entry in $jar_sets; do
    set=${entry%%:*}; pom=${entry#*:}
    if ! mvn -q -B -f "$pom" dependency:copy-dependencies \
        -DoutputDirectory="$ROOT/.jvm.tmp/$set" >".jvm.tmp/mvn-$set.log" 2>&1; then
      grep -E 'ERROR|error' ".jvm.tmp/mvn-$set.log" | head -5 >&2
      die "mvn could not fetch the jars of $pom (is Maven Central reachable?)"
    fi
  done
  rm -f .jvm.tmp/mvn-*.log
  # exactly the locked jars, each with its locked checksum: no more, no fewer
  listed=$(awk '{print $2}' infra/jvm/jars.sha256 | sort)
  found=$(cd .jvm.tmp && find . -name '*.jar' -o -name '*.tar.gz' | sed 's|^\./||' | sort)
  if [ "$listed" != "$found" ]; then
    die "the jars Maven fetched differ from infra/jvm/jars.sha256 (run 'make lock-jvm' after changing a pom): $(diff <(echo "$listed") <(echo "$found") | grep '^[<>]' | tr '\n' ' ')"
  fi
  (cd .jvm.tmp && sha256sum --quiet -c "$ROOT/infra/jvm/jars.sha256") \
    || die "a JVM jar does not match its checksum in infra/jvm/jars.sha256 (see above); nothing was installed"
  # the embedded Schema Registry runs from its unpacked archive (its own lib/, never on Spark's path)
  mkdir -p .jvm.tmp/registry/app && tar xzf .jvm.tmp/registry/*.tar.gz -C .jvm.tmp/registry/app \
    || die "could not unpack the Schema Registry's archive in .jvm.tmp/registry"
  rm -rf .jvm && mv .jvm.tmp .jvm
  echo "$jvm_stamp" > .jvm/.stamp
  say "JVM jars ready: $(wc -l < infra/jvm/jars.sha256) jars and archives in .jvm/ (checksums verified)"
fi

# --- Python environment ---------------------------------------------------------------------------
python_env() {
stamp_src=$(cat requirements.lock pyproject.toml infra/setup.sh | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f .venv/.setup-stamp ] && [ "$(cat .venv/.setup-stamp)" = "$stamp_src" ]; then
  return 0
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
say "ready: $ROOT/.venv ($(.venv/bin/python -c 'import pyspark; print("pyspark", pyspark.__version__)'))"
}
python_env

# --- Files from pinned Debian packages (version and checksum here; nothing else of the package is kept) ---
# deb_file PACKAGE VERSION SHA256 PATH DEST WHY: copy PATH (inside the package) to DEST, downloading the
# package with apt-get (no root needed; as root, the package lists are refreshed when it is not found),
# again only when VERSION changes. A package that cannot be downloaded is a warning naming what misses it.
deb_file() {
  local package=$1 version=$2 sha=$3 path=$4 dest=$5 why=$6 tmp deb
  if [ "$(cat "$dest.version" 2>/dev/null)" = "$version" ] && [ -f "$dest" ]; then
    return 0
  fi
  say "fetching $dest (Debian's $package $version)"
  tmp=$(dirname "$dest")/$package.tmp
  rm -rf "$tmp" && mkdir -p "$tmp"
  fetch() { (cd "$tmp" && apt-get download -qq "$package=$version" 2>/dev/null); }
  if ! fetch && [ "$(id -u)" = 0 ]; then apt-get update -qq >/dev/null 2>&1; fetch; fi
  deb=$(ls "$tmp"/"${package}"_*.deb 2>/dev/null | head -n1)
  if [ -z "$deb" ]; then
    say "warning: could not download Debian's $package $version: $why (a newer Debian release: update its version and checksum in infra/setup.sh)"
  elif [ "$(sha256sum "$deb" | cut -d' ' -f1)" != "$sha" ]; then
    die "$deb does not match its checksum in infra/setup.sh; nothing was installed"
  else
    dpkg-deb -x "$deb" "$tmp/x" && cp "$tmp/x/$path" "$dest"
    echo "$version" > "$dest.version"
  fi
  rm -rf "$tmp"
}

# promtool checks and unit-tests infra/monitoring/alerts.yml (nothing at run time needs it): Prometheus'
# own rule checker, a static Go binary; after the Python environment, whose bootstrap of uv makes .tools/ anew.
mkdir -p .tools/bin
deb_file prometheus 2.42.0+ds-5+deb12u1 81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55 \
  usr/bin/promtool .tools/bin/promtool "the alert rules' test will fail until promtool is in .tools/bin"
# jemalloc, the C allocator every Spark driver JVM the product starts preloads (spark_jobs/seams/jvm.py,
# ALLOCATOR): under RocksDB's churn glibc's allocator fragments, and the join's process grew 40 MB a
# minute on it, flat on jemalloc (docs/benchmarks.md, "Steady state"). Debian's amd64 build.
if [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ]; then
  mkdir -p build/native
  deb_file libjemalloc2 5.3.0-1 a4117c23c5c8acf6c9678a6cb086f000b79476369da7efe8a78a70826956ad3d \
    usr/lib/x86_64-linux-gnu/libjemalloc.so.2 build/native/libjemalloc.so.2 \
    "Spark's JVMs will run on glibc's allocator and hold more memory"
else
  say "warning: no pinned jemalloc for $(dpkg --print-architecture 2>/dev/null || uname -m); Spark's JVMs run on the C library's allocator"
fi

# --- Java built here with javac: the join operators and the Kafka Streams peer ---------------------
# build_jar NAME SOURCES JAR CLASSPATH VERSION: compile SOURCES' .java files against CLASSPATH into
# JAR (its folder holds the classes and a stamp), again only when a source or VERSION (what they are
# compiled against) changes.
build_jar() {
  local name=$1 src=$2 jar=$3 classpath=$4 version=$5
  local out stamp
  out=$(dirname "$jar")
  stamp=$( (find "$src" -name '*.java' | sort | xargs cat; echo "$version") | sha256sum | cut -d' ' -f1)
  if [ -f "$jar" ] && [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  rm -rf "$out" && mkdir -p "$out/classes"
  javac -nowarn -Xlint:none -d "$out/classes" -cp "$classpath" $(find "$src" -name '*.java' | sort) \
    || die "javac could not build the $name in $src (see above)"
  jar cf "$jar" -C "$out/classes" .
  echo "$stamp" > "$out/.stamp"
  say "$name built: $jar"
}

# The join operators (spark_jobs/joins/java): Spark's state operators of the joins are Java (a Python
# stateful processor pays a Python call and state-server round trips per key), built against the jars
# of the installed pyspark.
command -v javac >/dev/null 2>&1 || apt_install openjdk-17-jdk-headless "javac is missing (it builds the join operators)" \
  || die "javac (a JDK 17+) is needed to build the join operators. Install it, e.g. 'sudo apt-get install openjdk-17-jdk-headless', then rerun."
spark_jars=$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(pyspark.__path__[0], "jars"))')
build_jar "join operators" spark_jobs/joins/java build/jvm/lake-joins.jar "$spark_jars/*:.jvm/spark/*" \
  "$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)') $(cat .jvm/.stamp)"
# The record formats' decoders (spark_jobs/formats/java): Schema Registry framed Avro and Protobuf
# records decoded on the executors, against pyspark's jars and the locked protobuf-java.
build_jar "record format decoders" spark_jobs/formats/java build/jvm/formats/lake-formats.jar \
  "$spark_jars/*:.jvm/spark/*" "$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)') $(cat .jvm/.stamp)"
# The seams' classes (spark_jobs/seams/java): the changelog's writer on the executors, which the Kafka
# seam drives, and the Delta log store of s3a:// roots; against pyspark's jars, the locked Kafka
# client, Delta's storage API and Hadoop's S3A.
build_jar "seams' classes" spark_jobs/seams/java build/jvm/seams/lake-seams.jar \
  "$spark_jars/*:.jvm/spark/*" "$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)') $(cat .jvm/.stamp)"
# The Kafka Streams peer (tests/bench/peer): the benchmarks' peer (docs/benchmarks.md, "Against Kafka Streams") and
# the test that its outputs equal the product's, built against the locked .jvm/streams jars.
build_jar "Kafka Streams peer" tests/bench/peer/src/main/java build/peer/lake-peer.jar ".jvm/streams/*" \
  "$(cat .jvm/.stamp)"
# The Spark driver's class-data archive (spark_jobs/seams/jvm.py, write_class_archive): the classes a Spark start
# loads, parsed and verified once, so each later start maps them (a CLI command starts about twice as
# fast). Written again when what it was taken from changes: the JDK, the Python set, the jars.
cds_stamp=$( (java -version 2>&1; cat .venv/.setup-stamp .jvm/.stamp build/jvm/.stamp build/jvm/formats/.stamp build/jvm/seams/.stamp spark_jobs/seams/jvm.py) | sha256sum | cut -d' ' -f1)
if ! [ -f build/cds/spark-driver.jsa ] || [ "$(cat build/cds/.stamp 2>/dev/null)" != "$cds_stamp" ]; then
  say "writing the Spark driver's class-data archive (a Spark start with a small Delta workload, about a minute)"
  .venv/bin/python -c 'from spark_jobs.seams.jvm import write_class_archive; write_class_archive()' \
    || die "could not write build/cds/spark-driver.jsa (see above)"
  echo "$cds_stamp" > build/cds/.stamp
  say "class-data archive ready: build/cds/spark-driver.jsa ($(du -m build/cds/spark-driver.jsa | cut -f1) MB)"
fi
