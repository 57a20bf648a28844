# `make demo`: set everything up and verify every op on the default target's device.
# `make test`: set everything up and run the whole test suite (what CI runs).
.PHONY: setup demo test test-quick lint

setup:
	bash ci/setup.sh

demo: setup
	.venv/bin/deploy test --target x86

test: setup
	.venv/bin/python -m pytest -q

test-quick: setup
	.venv/bin/python -m pytest -q -m "not emulator and not slow"

lint: setup
	.venv/bin/ruff check .
