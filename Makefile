# BEGIN INSTRUCTOR ONLY (course/make_student.py leaves these lines out of the student release)
# The two commands a newcomer needs: `make demo` and `make test`.
# END INSTRUCTOR ONLY
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# PyTorch is only an optional reference for tests and benchmarks; set WITH_TORCH=0 to skip it.
WITH_TORCH ?= 1
PYTEST_ARGS ?=

# BEGIN INSTRUCTOR ONLY
# The course: `make student` writes the student release to build/student.
# END INSTRUCTOR ONLY
# `make grade` scores the graded tests (HIDDEN=dir adds an instructor's hidden tests;
# GRADE_ARGS=--strict exits 1 unless every graded test passes).
HIDDEN ?=
GRADE_ARGS ?=

.PHONY: install lint test test-cuda-sanitize fuzz bench clean grade

install:
	@echo "make install (1/2): needle and its dev tools (pip, a few minutes the first time)"
	$(PIP) install -q -e ".[dev]"
	@if [ "$(WITH_TORCH)" = "1" ]; then \
		echo "make install (2/2): CPU PyTorch, a reference for tests (WITH_TORCH=0 skips it)"; \
		$(PIP) install -q torch==2.13.0 || echo "torch not installed: torch comparisons will skip"; \
	fi

# BEGIN INSTRUCTOR ONLY
.PHONY: demo
demo: install
	$(PYTHON) -m apps.demo
# END INSTRUCTOR ONLY

# pyflakes, pycodestyle and import order (ruff.toml), then types (mypy.ini); `make test` runs
# it first. (In the student release types are not checked: the stubs leave attributes that
# only the exercises set, and `python -m mypy` is there for whoever wants it.)
lint:
	$(PYTHON) -m ruff check .
# BEGIN INSTRUCTOR ONLY
	$(PYTHON) -m mypy
# END INSTRUCTOR ONLY

test: install lint
	$(PYTHON) -m pytest -q $(PYTEST_ARGS) tests

# The differential test against PyTorch (tests/ops/test_differential*.py) with FUZZ_CASES cases
# per op (a fifth of them on the emulated GPU) from a new seed, printed first; FUZZ_SEED=n
# replays a run. `make test` runs the same test with few cases from seed 0.
FUZZ_CASES ?= 2000
ifeq ($(FUZZ_SEED),)
FUZZ_SEED := $(shell date +%s)
endif
fuzz: install
	@echo "make fuzz: FUZZ_SEED=$(FUZZ_SEED) FUZZ_CASES=$(FUZZ_CASES)"
	NEEDLE_FUZZ_SEED=$(FUZZ_SEED) NEEDLE_FUZZ_CASES=$(FUZZ_CASES) \
		NEEDLE_FUZZ_CUDA_CASES=$$(( $(FUZZ_CASES) / 5 )) NEEDLE_CUDA_TEST_TIMEOUT=7200 \
		$(PYTHON) -m pytest -q $(PYTEST_ARGS) tests/ops/test_differential.py \
		tests/ops/test_differential_primitives.py

# Every CUDA kernel test on the emulator's thread engine under ThreadSanitizer, then
# AddressSanitizer (tools/sanitize.py): fails on a data race, an
# out-of-bounds access or a divergent barrier. `make test` runs the float32 part of it
# (tests/backend_cuda/emulator/test_emu_sanitize.py). Installs gcc's runtimes when missing.
# Prints each report in full (OS threads named "B<block> T<thread>", every kernel frame with
# its .cu file:line); about 7 minutes on 2 cores (ThreadSanitizer 5.5, AddressSanitizer 1; more
# the first time, compiling). Pytest arguments after
# --: `python -m tools.sanitize --mode thread -- -k float32`. Without a
# sanitizer, NEEDLE_CUDA_EMULATOR_CHECK=full catches shared-memory races and uninitialised reads.
test-cuda-sanitize: install
	@for lib in libtsan.so libasan.so; do \
		p=$$($(CXX) -print-file-name=$$lib); \
		[ -e "$$p" ] || (apt-get update -q && apt-get install -y -q libtsan2 libasan8) || \
			{ echo "test-cuda-sanitize needs gcc's libtsan2 and libasan8"; exit 1; }; \
	done
	$(PYTHON) -m tools.sanitize --mode both

# Every CPU benchmark, one after the other (run on a quiet machine); figures go in
# benchmarks/README.md.
# BEGIN INSTRUCTOR ONLY
# GPU: see benchmarks/README.md (needs a CUDA machine).
# END INSTRUCTOR ONLY
bench: install
	$(PYTHON) benchmarks/bench_op_overhead.py
	$(PYTHON) benchmarks/bench_train.py
	$(PYTHON) benchmarks/bench_memory.py
	$(PYTHON) -m needle.parallel.launch -n 2 --no-prefix benchmarks/bench_collectives.py
	$(PYTHON) -m needle.parallel.launch -n 2 --no-prefix benchmarks/bench_data_parallel.py
	$(PYTHON) -m needle.parallel.launch -n 4 --no-prefix benchmarks/bench_data_parallel.py --zero
	$(PYTHON) -m needle.parallel.launch -n 4 --no-prefix benchmarks/bench_data_parallel.py --ps \
		--plot benchmarks/param_server.png
	$(PYTHON) benchmarks/bench_model_parallel.py --figures
	$(PYTHON) -m needle.parallel.launch -n 2 --no-prefix benchmarks/bench_moe.py
	$(PYTHON) -m needle.parallel.launch -n 4 --no-prefix benchmarks/bench_moe.py
	$(PYTHON) benchmarks/bench_multihost.py  # needs root (network namespaces); else says why
	cd benchmarks && $(PYTHON) bench_compile.py --steps 9

# BEGIN INSTRUCTOR ONLY
# On a machine with a GPU: the CUDA tests, the hw3 notebook, compute-sanitizer, kernel and
# training-step benchmarks beside PyTorch, the emulator against the GPU; at most 8 minutes on
# one H100; report in $$OUT or build/gpu-check (tools/gpu_check.py; benchmarks/README.md "GPU").
# Needs a CUDA GPU, CuPy, a CUDA PyTorch and needle's requirements; no install step and no
# network: where these are missing, carry the wheels and headers of tools/gpu_check_carry.sh.
.PHONY: gpu-check mutate student
gpu-check:
	PYTHONPATH=$(CURDIR) $(PYTHON) tools/gpu_check.py

# Plant each bug of tools/mutate.py's list in a copy of the tree, run that module's tests,
# print caught/survived per mutant and the score (minutes; not part of `make test`).
mutate:
	$(PYTHON) tools/mutate.py

student: install
	$(PYTHON) -m course.make_student --out build/student
# END INSTRUCTOR ONLY

# Installs (pip: the network) only when needle or a tool of its dev extra is not installed
# (course/installed.py), so grading needs no network after the first `make install`.
grade:
	@$(PYTHON) -m course.installed || $(MAKE) --no-print-directory install
	$(PYTHON) -m course.grade $(if $(HIDDEN),--hidden $(HIDDEN)) $(GRADE_ARGS)

clean:
	rm -rf build *.egg-info .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
