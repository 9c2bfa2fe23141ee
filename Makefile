# execbox: `make up` starts the service, `make test` runs every check and test.
.PHONY: install venv engine images up down up-host down-host test check unit integration stack-test cluster-up cluster-down cluster-test bench bench-peers clean

# Each set-up phase says how long it took (scripts/phase); `make up` ends with the list. .ci/run
# sets EXECBOX_PHASES and EXECBOX_T0 itself, to list the whole run's phases.
ifndef EXECBOX_PHASES
export EXECBOX_PHASES := $(CURDIR)/.run/phases.log
export EXECBOX_T0 := $(shell date +%s.%N)
$(shell mkdir -p .run && : > .run/phases.log)
endif

install:
	@scripts/phase install scripts/install

venv:
	scripts/install --python

engine: install
	@scripts/phase engine scripts/engine

# The sandbox images and the service image, side by side, on the one base image (debootstrap, Debian
# 13), which scripts/images builds first when missing.
images: engine
	@scripts/images

# The compose stack (API, workers, Redis with AOF). `make up-host` runs the same as host processes.
up: images
	@EXECBOX_QUIET=1 scripts/phase "stack start" scripts/stack up
	@scripts/stack summary

down:
	scripts/stack down
	scripts/services down

up-host: images
	scripts/services up

down-host:
	scripts/services down

check: install
	scripts/check

# The fast tier: no root, no Docker, no apt; needs python3 and, on PATH, redis-server, bwrap and kustomize
# (scripts/install installs them). Two processes (pytest-xdist), each with its own redis-server. Prints
# branch coverage and fails under its floor ([tool.coverage] in pyproject.toml); make test applies the
# same floor.
unit: venv
	.venv/bin/pytest -n 2 -m "not docker and not stack" --cov=execbox --cov=execbox_client tests/unit

# The integration tier in two parts: the tests marked `serial` (they measure timings, or count what the
# whole host runs) first, alone on the machine; then the rest on two processes, each testing a
# deployment of its own (its Redis, API, workers, docker proxy, bubblewrap helper and uid range), a
# test file's tests on one process (--dist loadfile: a module's fixtures are made once).
INTEGRATION_SERIAL = -m serial tests/integration
INTEGRATION_REST = -m "not serial" -n 2 --dist loadfile tests/integration

integration: images
	.venv/bin/pytest $(INTEGRATION_SERIAL)
	.venv/bin/pytest $(INTEGRATION_REST)

# The unit tier on two processes as in `make unit`, then the integration tier as in `make integration`,
# with the coverage appended and the floor applied to all three; the slowest tests are listed so that a
# slower CI names its cause.
COV = --cov=execbox --cov=execbox_client --cov-report= --cov-fail-under=0
test: images check
	.venv/bin/pytest -n 2 $(COV) tests/unit
	.venv/bin/pytest $(COV) --cov-append --durations=10 $(INTEGRATION_SERIAL)
	.venv/bin/pytest --cov=execbox --cov=execbox_client --cov-append --durations=25 $(INTEGRATION_REST)

# Brings the compose stack up with three workers, runs tests/stack and langchain-tests' sandbox
# suite (scripts/conformance) against it, takes it down. It replaces a running `make up` stack, on
# data volumes of its own (EXECBOX_DATA), empty at the start and removed at the end: one run's
# executions and files never fill the next run's Redis, and `make up`'s data stays.
stack-test: export EXECBOX_DATA = execbox-test
stack-test: images
	scripts/stack down --data
	scripts/stack up --scale worker=3
	.venv/bin/pytest tests/stack -p no:cacheprovider --durations=0; status=$$?; \
	  scripts/conformance -q || status=1; scripts/stack down --data; exit $$status
	@test -z "$$(docker ps -aq --filter label=com.docker.compose.project=execbox)" || { echo "stack-test: containers left" >&2; exit 1; }
	@test -z "$$(docker network ls -q --filter label=com.docker.compose.project=execbox)" || { echo "stack-test: network left" >&2; exit 1; }
	@test -z "$$(docker ps -aq --filter label=execbox.deployment=execbox)" || { echo "stack-test: sandboxes left" >&2; exit 1; }
	@test -z "$$(docker volume ls -q --filter label=execbox.deployment=execbox)" || { echo "stack-test: workspaces left" >&2; exit 1; }
	@test -z "$$(docker images -q --filter dangling=true --filter label=org.execbox.built)" || { echo "stack-test: dangling images left" >&2; exit 1; }

# Many hosts (issue 30): three Docker engines on this machine, each in a network namespace of its
# own, in a Swarm of three managers (scripts/cluster), with deploy/swarm/stack.yml deployed on it.
# cluster-test starts from nothing, runs tests/cluster (which break the cluster on purpose: a
# volume server, the Redis primary, a whole node) and removes it all, also when a test fails.
cluster-up: images
	@scripts/phase "cluster up" scripts/cluster up
	@scripts/phase "cluster deploy" scripts/cluster deploy

cluster-down:
	@scripts/phase "cluster down" scripts/cluster down

cluster-test: images
	@scripts/phase "cluster down (leftovers)" scripts/cluster down
	@scripts/phase "cluster up" scripts/cluster up && scripts/phase "cluster deploy" scripts/cluster deploy \
	  && scripts/phase "cluster tests" .venv/bin/pytest tests/cluster -p no:cacheprovider -p no:randomly -s --timeout 600 --durations=0; \
	  status=$$?; scripts/phase "cluster down" scripts/cluster down; exit $$status

# The short default (< 10 min on 2 cores); BENCH=full for the long series (about 60 min). Both
# also measure the stack `make up` started when it answers on :8000.
BENCH ?= short
bench: images
	.venv/bin/pip install -q -c constraints.txt -e '.[bench]'
ifeq ($(BENCH),full)
	.venv/bin/python bench/compare.py
	.venv/bin/python bench/closed_loop.py --runs 200 --orderings --preload-off $$(curl -fsS -o /dev/null http://127.0.0.1:8000/readyz 2>/dev/null && echo --stack)
else
	.venv/bin/python bench/compare.py --runs 20 --seconds 15 --concurrency 1 8 --memory-runs 300
	.venv/bin/python bench/closed_loop.py --runs 30 --clients 1 8 $$(curl -fsS -o /dev/null http://127.0.0.1:8000/readyz 2>/dev/null && echo --stack)
endif

# execbox beside its peers (issue 35): llm-sandbox (fresh and pooled), epicbox, `docker run` and
# native Python on the same image, closed and paced (about 10 min on 2 cores). The peers go into
# .venv-peers (bench/peers.py makes it from PyPI); their containers are removed at the end.
# PEERS_ARGS passes options, e.g. PEERS_ARGS="--runs 3".
bench-peers: images
	.venv/bin/pip install -q -c constraints.txt -e '.[bench]'
	.venv/bin/python bench/peers.py $(PEERS_ARGS)

# Everything execbox built and started: the stack, host services, its images, run state, wheels and
# the conformance and peers virtualenvs (.venv, the development environment, stays).
clean: down
	scripts/prune-images --all
	rm -rf .run .venv-conformance .venv-conformance.log .venv-peers deploy/docker/wheels build sandbox-images/*/wheels sandbox-images/*/versions.json
