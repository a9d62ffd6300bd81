# The two commands of README.md; each does its own set-up first (scripts/setup.sh is idempotent).
PY := .venv/bin/python

.PHONY: setup demo test unit render bench
setup:
	scripts/setup.sh

# The whole pipeline on the example product: build, archive, round trip, smoke gates, release/1.3.1/.
demo: setup
	$(PY) build.py --profile all --force

# The whole suite: unit tests and engine tests against the real engine.
test: setup
	$(PY) -m pytest

# Unit tests only (no engine needed).
unit:
	scripts/setup.sh --venv
	$(PY) -m pytest tests/unit

# The performance benchmark (about 2.5 GB, a few minutes): prints a table, writes docs/BENCHMARKS.md.
bench: setup
	$(PY) benchmarks/bench.py

# Re-render every golden after a template or YAML change (review the diff, then commit).
render:
	scripts/setup.sh --venv
	$(PY) build.py --stage render
	$(PY) build.py --stage render --profile tp4
	$(PY) build.py --stage render --config tests/fixtures/busybox-product/profiles
	for d in examples/*/profiles; do $(PY) build.py --stage render --config $$d; done
