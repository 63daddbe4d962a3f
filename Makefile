# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# PyTorch is only an optional reference for tests and benchmarks; set WITH_TORCH=0 to skip it.
WITH_TORCH ?= 1
PYTEST_ARGS ?=

# The course: `make student` writes the student release to build/student; `make grade` scores
# the graded tests (HIDDEN=dir adds an instructor's hidden tests).
HIDDEN ?=

.PHONY: install demo lint test test-cuda-sanitize bench clean student grade

install:
	$(PIP) install -q -e ".[dev]"
	@if [ "$(WITH_TORCH)" = "1" ]; then \
		$(PIP) install -q torch==2.13.0 || echo "torch not installed: torch comparisons will skip"; \
	fi

demo: install
	$(PYTHON) -m apps.demo

# pyflakes, pycodestyle and import order (ruff.toml), then types (mypy.ini); `make test` runs
# it first.
lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

test: install lint
	$(PYTHON) -m pytest -q $(PYTEST_ARGS) tests

# Every CUDA kernel test on the emulator's thread engine under ThreadSanitizer, then
# AddressSanitizer (needle/backend_cuda/emulator/sanitize.py): fails on a data race, an
# out-of-bounds access or a divergent barrier. `make test` runs the float32 part of it
# (tests/backend_cuda/emulator/test_emu_sanitize.py). Installs gcc's runtimes when missing.
# Prints each report in full (OS threads named "B<block> T<thread>"); pytest arguments after
# --: `python -m needle.backend_cuda.emulator.sanitize --mode thread -- -k float32`. Without a
# sanitizer, NEEDLE_CUDA_EMULATOR_CHECK=full catches shared-memory races and uninitialised reads.
test-cuda-sanitize: install
	@for lib in libtsan.so libasan.so; do \
		p=$$($(CXX) -print-file-name=$$lib); \
		[ -e "$$p" ] || (apt-get update -q && apt-get install -y -q libtsan2 libasan8) || \
			{ echo "test-cuda-sanitize needs gcc's libtsan2 and libasan8"; exit 1; }; \
	done
	$(PYTHON) -m needle.backend_cuda.emulator.sanitize --mode both

# Every CPU benchmark, one after the other (run on a quiet machine); figures go in
# benchmarks/README.md. GPU: see benchmarks/README.md (needs a CUDA machine).
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
	$(PYTHON) benchmarks/bench_multihost.py  # needs root (network namespaces); else says why
	cd benchmarks && $(PYTHON) bench_compile.py --steps 9

student:
	$(PYTHON) -m course.make_student --out build/student

grade: install
	$(PYTHON) -m course.grade $(if $(HIDDEN),--hidden $(HIDDEN))

clean:
	rm -rf build *.egg-info .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
