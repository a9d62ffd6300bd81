# The two commands of README.md; each does its own set-up first (scripts/setup.sh is idempotent).
PY := .venv/bin/python

.PHONY: setup demo demo-arm64 test unit render bench prune
setup:
	scripts/setup.sh

# The whole pipeline on the example product: build, archive, round trip, smoke gates, release/1.3.1/.
demo: setup
	$(PY) build.py --profile all --force

# The example product for linux/arm64, under emulation on an amd64 machine: release/1.3.1-arm64/.
demo-arm64: setup
	$(PY) build.py --profile all --platform linux/arm64 --force

# The whole suite: unit tests and engine tests against the real engine, with coverage of both
# (printed), held to 90 % of the package and 75 % of every module.
test: setup
	rm -f .coverage .coverage.*
	$(PY) -m pytest
	$(PY) scripts/coverage_check.py

# Unit tests only (no engine needed).
unit:
	scripts/setup.sh --venv
	$(PY) -m pytest tests/unit --no-cov

# The performance benchmark (about 20 minutes, the engine to itself: it removes every tag and dangling image that
# appears while it runs): prints a table, writes docs/BENCHMARKS.md.
bench: setup
	$(PY) benchmarks/bench.py

# Re-render every golden after a template or YAML change (review the diff, then commit).
render:
	scripts/setup.sh --venv
	$(PY) build.py --quiet --stage render --platform linux/amd64
	$(PY) build.py --quiet --stage render --platform linux/arm64
	$(PY) build.py --quiet --stage render --platform linux/amd64 --profile tp4
	$(PY) build.py --quiet --stage render --platform linux/amd64 --config tests/fixtures/busybox-product/profiles
	for d in examples/*/profiles; do $(PY) build.py --quiet --stage render --platform linux/amd64 --config $$d; done
	for d in examples/*/profiles; do if [ -d $$d/../dockerfiles/rendered/tp4 ]; then \
	  $(PY) build.py --quiet --stage render --platform linux/amd64 --profile tp4 --config $$d; fi; done
	$(PY) -m unibake.manifest > docs/manifest.schema.json

# Remove old release images and unibake's build cache from the engine (release folders stay).
prune: setup
	$(PY) build.py prune
