# FC² platform. Quick start: `make run`, then `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
# The example bundles (examples/README.md): examples/<name>/ builds examples/dist/fc2_<name>-0.1.0-py3-none-any.whl,
# TensorFlow's digits_cnn and PyTorch's digits_torch.
EXAMPLE_WHEELS := examples/dist/fc2_digits_cnn-0.1.0-py3-none-any.whl examples/dist/fc2_digits_torch-0.1.0-py3-none-any.whl
# PyTorch's CPU build (pyproject.toml): from a folder of wheels where there is one, else from PyTorch's CPU index.
TORCH_WHEELS ?= /opt/wheels
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_SOURCE = $(if $(wildcard $(TORCH_WHEELS)/torch-*+cpu-*.whl),--find-links $(TORCH_WHEELS),--extra-index-url $(TORCH_INDEX))

.PHONY: run setup test lint format examples benchmark browser sandbox lab clean

# The virtualenv is rebuilt whenever pyproject.toml changes. setuptools cautions at every editable install that a
# folder in the working directory named like a package shadows the installed one: here that is the point (the
# platform runs from its checkout), so that one warning is filtered.
$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet $(TORCH_SOURCE) -e '.[dev]'
	touch $@

.SECONDEXPANSION:
$(EXAMPLE_WHEELS): examples/dist/fc2_%-0.1.0-py3-none-any.whl: $(BIN)/.installed \
		$$(shell find examples/$$* -name '*.py' -o -name pyproject.toml)
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation -w examples/dist examples/$*

examples: $(EXAMPLE_WHEELS)

# With DEBUG on (`make run`), the data directory is marked as a development checkout's (fc2/settings.py,
# DEVELOPMENT_MARK): the README's `manage.py` commands then run in a fresh shell with the same defaults.
setup: $(BIN)/.installed examples sandbox
	@case "$$(printf %s "$${DEBUG:-}" | tr A-Z a-z)" in 1|true|yes|on) \
		mkdir -p "$${FC2_VAR_DIR:-var}" && touch "$${FC2_VAR_DIR:-var}/development";; esac
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py setup_platform

# The platform on 127.0.0.1:8000 with a Celery worker beside it (SQLite, embedded broker, local provider by default),
# both started and watched by `manage.py serve` (fc2/management/commands/serve.py): a child that dies is started again
# after a backoff, said in the log, and Ctrl-C or TERM stops both within seconds (FC2_SERVE_STOP_S).
# The worker also runs Celery beat (-B), whose sweep moves on or fails the jobs of a lost worker
# (fc2/services/sweep.py); its schedule file is var/celerybeat-schedule. DEBUG=1 (for `setup` too): this is the
# development server, and settings refuse to run with DEBUG off and no SECRET_KEY.
# `make run HOST=0.0.0.0 PORT=8080` serves elsewhere.
# The demo accounts' passwords are in var/demo-passwords.txt (mode 0600), said last before the servers' output begins.
# The platform runs as root on purpose: the job sandbox needs it (provisioner/sandbox.py). Celery warns about that
# at every start and advises --uid, which would take the sandbox away and so refuse every local job; with JSON, not
# pickle, as the only content it accepts (fc2/settings.py), the risk it warns of is not there. The filter names that one
# warning, so any other still shows.
run: export DEBUG ?= 1
run: setup
	@echo "FC² platform on http://$(HOST):$(PORT)/ (Ctrl-C stops the web server and the worker)"
	@passwords=$${FC2_VAR_DIR:-var}/demo-passwords.txt; [ ! -f "$$passwords" ] || \
		echo "The demo accounts' passwords: $$passwords (\`manage.py changepassword USERNAME\` changes one)"
	@export FC2_PUBLIC_URL=$${FC2_PUBLIC_URL:-http://$(HOST):$(PORT)}; \
	PYTHONWARNINGS="ignore:You're running the worker with superuser privileges" \
	exec $(BIN)/python manage.py serve $(HOST):$(PORT)

# Local jobs run sandboxed (provisioner/sandbox.py): bubblewrap, setpriv and nsenter (util-linux), ip (iproute2).
# Installed when the platform runs as root and they are missing; otherwise the platform says at start why local jobs
# are refused.
sandbox:
	@command -v bwrap >/dev/null && command -v ip >/dev/null && command -v mkfs.ext4 >/dev/null && \
		/sbin/ldconfig -p | grep -q 'libseccomp\.so\.2 ' || [ "$$(id -u)" != 0 ] || { \
		echo "installing bubblewrap, iproute2 and libseccomp2 for the job sandbox"; \
		apt-get install -y -q bubblewrap iproute2 util-linux e2fsprogs libseccomp2 >/dev/null 2>&1 || { apt-get update -q && \
		apt-get install -y -q bubblewrap iproute2 util-linux e2fsprogs libseccomp2; }; }

# The lab provider (provisioner/lab/) runs Debian's OpenSSH server in each node's network namespace, delays the
# nodes' traffic with iptables and turns IPv6 off in them with sysctl (procps); `make test` installs them (as root),
# `make run` leaves the choice to the operator: installed, the lab is offered. (On a machine with systemd, installing openssh-server also starts the
# machine's own sshd; the lab never uses it.)
lab:
	@{ test -x /usr/sbin/sshd && command -v iptables >/dev/null && command -v sysctl >/dev/null; } || \
		[ "$$(id -u)" != 0 ] || { \
		echo "installing openssh-server, iptables and procps for the lab provider"; \
		apt-get install -y -q openssh-server iptables procps >/dev/null 2>&1 || { apt-get update -q && \
		apt-get install -y -q openssh-server iptables procps; }; }

# The browser tests drive Debian's chromium through Playwright (Playwright's own browser download is not used).
# Installed as root; as another user a missing chromium stops `make test` saying so, rather than apt-get failing.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] || { \
		echo "chromium is missing: the browser tests need Debian's chromium (as root: apt-get install chromium)" >&2; \
		exit 1; }; \
		echo "installing Debian's chromium for the browser tests"; \
		apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q chromium; }; }

# The tests load their own settings (fc2/settings_test.py); the migrations check is a manage.py command like any.
# pytest runs in three parts (docs/OPERATIONS.md, "Development"), each even when one before it failed, so that one run
# says every failure: the light tests spread over TEST_PROCESSES processes (pytest-xdist; each its own test database
# and FC2_VAR_DIR); the `heavy` ones (real clusters, the lab, outages: mostly waiting) HEAVY_PROCESSES at a time, work
# stolen by whichever process is free; then the `alone` ones, one at a time. Four heavy processes on two cores: the
# part ended 13 % sooner than with three (each test 13 % slower, a third more of them at once).
TEST_PROCESSES ?= auto
HEAVY_PROCESSES ?= 4
test: export DEBUG ?= 1
test: $(BIN)/.installed examples browser sandbox lab
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/pytest -m "not heavy and not alone" -n $(TEST_PROCESSES); light=$$?; \
	$(BIN)/pytest -m heavy -n $(HEAVY_PROCESSES) --dist worksteal; heavy=$$?; \
	$(BIN)/pytest -m alone; alone=$$?; \
	[ $$light = 0 ] && [ $$heavy = 0 ] && [ $$alone = 0 ]

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

format:
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

benchmark: export DEBUG ?= 1
benchmark: setup
	$(BIN)/python benchmarks/spine.py

clean:
	rm -rf var examples/dist examples/digits_cnn/build examples/digits_torch/build
