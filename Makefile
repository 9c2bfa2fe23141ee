# execbox: `make up` starts the service, `make test` runs every check and test.
.PHONY: install engine images up down test check unit integration bench clean

install:
	scripts/install

engine: install
	scripts/engine

images: engine
	sandbox-images/build.sh

up: images
	scripts/services up

down:
	scripts/services down

check: install
	scripts/check

unit: install
	.venv/bin/pytest tests/unit

integration: images
	.venv/bin/pytest tests/integration

test: images check
	.venv/bin/pytest tests

bench: images
	.venv/bin/python bench/latency.py

clean: down
	rm -rf .run
