# One-command set-up: every target builds the virtual environment first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.torchtpu-installed

.PHONY: demo test test-tpu test-asan bench lint

$(STAMP): pyproject.toml setup.py $(wildcard src/torchtpu/csrc/*.cpp src/torchtpu/csrc/*.h)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first: the C++ shim builds against its headers (no build isolation).
	$(PY) -m pip install -q torch==2.13.0 setuptools wheel
	# no backend autoload while building: an installed torchtpu with a stale _C would break it
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PY) -m pip install -q --no-build-isolation -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m torchtpu.demo

# One worker per core, at most 4 (each holds a PyTorch and an XLA client): run serially, the
# suite leaves a core of two mostly idle. Whole files per worker, so that each file's tests
# run in their written order.
test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile

# On a TPU host where torch and torchtpu are installed (README "On a TPU VM", or
# ../shared/tpu/README.md): the default suite in one process, as one process at a time may hold
# the chip; tests about the CPU emulator itself are skipped there with their reason.
TPU_PYTHON ?= python3
test-tpu:
	TORCH_TPU_PJRT_PLUGIN=tpu $(TPU_PYTHON) -m pytest -q -rs

# The C++ extensions built with AddressSanitizer + UndefinedBehaviorSanitizer (a copy of src/ in
# build/asan, first on the path), run under the op tests, the errors-as-CPU table and the OpInfo
# subset; any report stops the run (halt_on_error). Python and torch are not sanitized: the
# sanitizer runtimes are preloaded, and leak checking is off (the interpreter's own allocations).
ASAN_DIR := build/asan
SAN_PRELOAD = $$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)
test-asan: $(STAMP)
	rm -rf $(ASAN_DIR) && mkdir -p $(ASAN_DIR)
	cp -r setup.py pyproject.toml README.md src $(ASAN_DIR)/ && find $(ASAN_DIR) -name '*.so' -delete
	cd $(ASAN_DIR) && TORCHTPU_SANITIZE=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(abspath $(PY)) setup.py -q build_ext --inplace
	PYTHONPATH=$(ASAN_DIR)/src LD_PRELOAD="$(SAN_PRELOAD)" \
	ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(PY) -m pytest -q -p no:cacheprovider -m "not slow and not fresh_process" \
	  tests/test_ops.py tests/test_errors_as_cpu.py tests/conformance/test_opinfo_subset.py

bench: $(STAMP)
	$(PY) bench/eager.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
