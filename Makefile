# The whole set-up is `make demo` (the main job: train the tiny CPU agent with TRACE) and `make test` (lint and
# the suite); each creates .venv first. `make test-core` runs the suite in a numpy-only .venv-core (the rest skips).
.PHONY: install models demo train simulate rollout evidence ablation propositions bench lint test test-core clean

install: .venv/.installed

.venv/.installed: pyproject.toml scripts/install.sh scripts/lib_env.sh
	scripts/install.sh
	touch $@

models: install
	MODELS=1 scripts/install.sh

demo train: install
	.venv/bin/trace-rl train

simulate: install
	.venv/bin/trace-rl simulate out=runs/simulate

rollout: install
	.venv/bin/trace-rl rollout out=runs/rollout

evidence: install
	.venv/bin/trace-rl simulate seeds=0,1,2,3 out=runs/simulate
	.venv/bin/trace-rl simulate ablation=true seeds=0,1,2,3 out=runs/ablation
	.venv/bin/trace-rl propositions

ablation: install
	.venv/bin/trace-rl simulate ablation=true out=runs/ablation

propositions: install
	.venv/bin/trace-rl propositions

bench: install
	.venv/bin/python bench/bench_allocation.py

lint: install
	.venv/bin/ruff check src tests bench lab
	.venv/bin/ruff format --check src tests bench lab

test: lint
	.venv/bin/python -m pytest tests

.venv-core/.installed: pyproject.toml scripts/install.sh scripts/lib_env.sh
	VENV=.venv-core CORE_ONLY=1 scripts/install.sh
	touch $@

test-core: .venv-core/.installed
	.venv-core/bin/python -m pytest tests

clean:
	rm -rf .venv .venv-core runs build *.egg-info src/*.egg-info
