# Developer loop. Every target sets up .venv first (idempotent, fast when nothing changed).
SHELL := /bin/bash
VENV  := .venv
BIN   := $(VENV)/bin
export PYSPARK_PYTHON := $(abspath $(BIN)/python)

.DEFAULT_GOAL := help
.PHONY: help setup demo pipeline airflow kafka-start kafka-stop registry-start registry-stop up down cluster-start cluster-stop test lint bench bench-cluster bench-peer bench-soak faults lock lock-jvm clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

setup: ## install Java and Maven (if missing), the locked JVM jars into .jvm and the locked Python environment into .venv
	@bash infra/setup.sh

demo: setup kafka-start registry-start ## the embedded Kafka broker and Schema Registry, the demo stories (consents, marketplace, people), dbt build of the marts, then the fk and list pipelines through Airflow
	@$(BIN)/lake demo consents marketplace people
	@echo; echo "== dbt build: staging views, the marts and their tests (lake dbt build)"
	@$(BIN)/lake dbt build
	@bash infra/airflow-pipeline.sh marketplace people
	@echo; echo "== what to open"
	@echo "the data-quality report, a section per pipeline (written by every quality run): file://$$($(BIN)/python -c 'from spark_jobs.seams.storage import resolve_root; from spark_jobs.layout import Layout; print(Layout(resolve_root()).report_folder.index)')"
	@echo "the marts, from a new Spark session: $(BIN)/lake sql 'SELECT * FROM marts.optout_feed'"
	@echo "the topics, as any Kafka client reads them: $(BIN)/lake consume customer_consents -f '%k,%p\\n'"
	@echo "operating the joins (docs/operating.md): KEEP_JOINS=1 make demo leaves them running; then $(BIN)/lake status --json gives each one's Prometheus metrics_url and consumer_group (kafka-consumer-groups --describe shows its lag); OPENLINEAGE_URL (or an openlineage.yml) sends the runs' lineage"
	@echo "the embedded Kafka broker and Schema Registry keep running: make kafka-stop registry-stop (or $(BIN)/lake down) stops them"

kafka-start: setup ## start the embedded single-node Kafka broker (KRaft) of the lake root, unless it runs
	@$(BIN)/lake kafka start

kafka-stop: ## stop the embedded Kafka broker
	@$(BIN)/lake kafka stop

registry-start: setup ## start the embedded Schema Registry of the lake root (Apicurio, Confluent's API), unless it runs
	@$(BIN)/lake registry start

registry-stop: ## stop the embedded Schema Registry (its schemas stay under the lake root)
	@$(BIN)/lake registry stop

up: setup ## the services: the embedded broker, the embedded Schema Registry and the Spark Connect server (a quick 'lake show'), unless they run
	@$(BIN)/lake up

down: ## stop the Spark Connect server, the embedded Schema Registry and the embedded broker
	@$(BIN)/lake down

pipeline: setup kafka-start registry-start ## the three bundled pipelines through Airflow only: pipeline DAG, joins, health check, stop
	@bash infra/airflow-pipeline.sh

airflow: setup ## Airflow 3 standalone on http://localhost:8080 with this repo's DAGs (Ctrl-C stops it)
	@$(BIN)/lake airflow standalone

cluster-start: setup ## a Spark standalone master + 2 workers on this machine (infra/spark-cluster.sh)
	@bash infra/spark-cluster.sh start

cluster-stop: ## stop the standalone cluster
	@bash infra/spark-cluster.sh stop

test: setup ## the test suite, exactly as CI runs it (two pytest workers, a test file per worker at a time)
	@$(BIN)/python -m pytest -m "not bench" -q -n 2 --dist loadfile --no-loadscope-reorder

lint: setup ## ruff + mypy on spark_jobs/
	@$(BIN)/ruff check spark_jobs tests dags && $(BIN)/ruff format --check spark_jobs tests dags && $(BIN)/mypy

bench: setup ## benchmarks (minutes); figures go to bench-results/ and belong in docs/benchmarks.md
	@mkdir -p bench-results
	@$(BIN)/python tests/bench/bench_produce.py | tee bench-results/produce.txt
	@$(BIN)/python tests/bench/bench_freshness.py | tee bench-results/freshness.txt
	@$(BIN)/python tests/bench/bench_quality.py | tee bench-results/quality.txt
	@$(BIN)/python tests/bench/bench_joins.py | tee bench-results/joins.txt
	@$(BIN)/python tests/bench/bench_s3.py | tee bench-results/s3.txt
	@$(BIN)/python tests/bench/bench_keyed.py --hot-million | tee bench-results/keyed.txt
	@$(BIN)/python tests/bench/bench_diagnose.py | tee bench-results/diagnose.txt
	@$(BIN)/python tests/bench/bench_cli.py | tee bench-results/cli.txt
	@LAKE_FAULT_KILLS=20 $(BIN)/python -m pytest -q tests/test_join_runner.py -k sigkill | tee bench-results/join-faults.txt
	@LAKE_PROPERTY_EXAMPLES=40 $(BIN)/python -m pytest -q tests/test_join_properties.py | tee bench-results/join-properties.txt

bench-cluster: setup ## the table-join benchmark on the standalone cluster (2 workers on this machine)
	@mkdir -p bench-results
	@bash infra/spark-cluster.sh start
	@LAKE_SPARK_MASTER=spark://127.0.0.1:$${SPARK_MASTER_PORT:-7077} $(BIN)/python tests/bench/bench_joins.py --no-deletion-vectors | tee bench-results/joins-cluster.txt; \
	  status=$$?; bash infra/spark-cluster.sh stop; exit $$status

bench-peer: setup ## the product's fk and list joins against the Kafka Streams peer on one broker, the fk join on Avro values against JSON, with its metrics scraped against metrics off, and against the product before provenance (PEER_BASELINE), lake explain on the fk result (about 35 min; PEER_PRODUCTS, PEER_PERSONS set the sizes; PEER_SCENARIOS="fk fk-no-metrics" runs only those)
	@mkdir -p bench-results
	@$(BIN)/python tests/bench/bench_peer.py $(PEER_SCENARIOS) | tee bench-results/peer.txt

bench-soak: setup ## steady state: the fk join and the Kafka Streams peer under product updates at 1,000/s, 5,000/s and the highest rate each sustains (30 min), then 1,000/s again on warm JVMs, CPU per 1,000 records, memory, lag, produce -> topic and -> Delta table per minute, a plot (about 2.5 h at full size; SOAK_MINUTES, SOAK_PRODUCTS, SOAK_RATES, SOAK_SYSTEMS)
	@mkdir -p bench-results
	@$(BIN)/python tests/bench/bench_soak.py | tee bench-results/soak.txt; exit $${PIPESTATUS[0]}

faults: setup ## the fault suite: a 3-broker SCRAM cluster (RF 3), brokers and join drivers killed -9, results checked exactly (about 35 min)
	@mkdir -p bench-results
	@$(BIN)/python tests/bench/faults.py | tee bench-results/faults.txt; exit $${PIPESTATUS[0]}

lock-jvm: ## re-fetch the JVM jars (and the registry's archive) of infra/jvm/*.pom.xml and tests/bench/peer/pom.xml and rewrite their checksums (needs Maven Central)
	@rm -rf .jvm.tmp && for entry in spark:infra/jvm/spark.pom.xml kafka:infra/jvm/kafka.pom.xml registry:infra/jvm/registry.pom.xml s3:infra/jvm/s3.pom.xml streams:tests/bench/peer/pom.xml; do \
	  mvn -q -B -f $${entry#*:} dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/.jvm.tmp/$${entry%%:*} >/dev/null || exit 1; done
	@cd .jvm.tmp && find . -name '*.jar' -o -name '*.tar.gz' | sed 's|^\./||' | sort | xargs sha256sum > ../infra/jvm/jars.sha256
	@rm -rf .jvm.tmp && echo "infra/jvm/jars.sha256: $$(wc -l < infra/jvm/jars.sha256) jars and archives locked"

lock: ## re-resolve requirements.lock from pyproject.toml (needs network)
	@bash infra/setup.sh
	@.tools/bin/uv pip compile pyproject.toml --extra platform --extra dev \
	  --excludes infra/lock-excludes.txt --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	  --generate-hashes -q -o requirements.lock --custom-compile-command "make lock"

clean: ## remove the demo lake and caches (keeps .venv)
	-@$(BIN)/lake down 2>/dev/null
	rm -rf lakehouse bench-results .pytest_cache .hypothesis .airflow
