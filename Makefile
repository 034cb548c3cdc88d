# moegen: `make demo` runs the main job, `make test` the test suite. Both set everything up.
VENV := .venv
BIN := $(VENV)/bin
JOBS ?= 2

.PHONY: setup demo test bench sweep mutate doctor clean

setup:
	@bash flows/setup.sh

demo: setup
	$(BIN)/moegen demo

# Both simulators, every registered block; Verilator builds are cached under build/sim.
# worksteal: a worker left idle takes pending tests from the other (the runs differ 100-fold).
test: setup
	$(BIN)/python -m pytest -n $(JOBS) --dist worksteal -m "not sweep" --durations=15 tests

# Long sweeps over larger and odder sizes (not part of `make test`).
sweep: setup
	$(BIN)/python -m pytest -n $(JOBS) -m sweep tests

# Mutation score of every block (docs/mutation.md); about an hour, not part of `make test`.
MUTANTS ?= 20
mutate: setup
	$(BIN)/moegen mutate --all -n $(MUTANTS)

bench: setup
	$(BIN)/moegen bench

doctor: setup
	$(BIN)/moegen doctor

clean:
	rm -rf build out
