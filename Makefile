# The two fresh-machine commands: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TIKTOKEN_CACHE_DIR ?= $(abspath ../shared/data/tiktoken)
TEST_WORKERS ?= 3  # pytest-xdist processes (0: one process); each takes its own Redis db (tests/conftest.py)
export TIKTOKEN_CACHE_DIR

.PHONY: run demo test test-fast install dev bench lint clean image

$(BIN)/keel: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.dev: $(BIN)/keel
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/keel
dev: $(VENV)/.dev

## run Keel: SQLite store, the built-in stand-in provider unless OPENAI_API_KEY is set
run: install
	$(BIN)/keel serve $(if $(CONFIG),--config $(CONFIG))

## see the saving: one agent conversation direct and through Keel (starts the quickstart unless a Keel runs on :8080)
demo: install
	$(BIN)/keel demo $(if $(URL),--url $(URL))

## install what the tests need and run them
test: dev
	$(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

## the unit tier only (no servers; seconds): the spine's pieces on their own
test-fast: dev
	$(BIN)/python -m pytest -q -p no:xdist tests/unit

## the Docker image, tiktoken's encodings from $(TIKTOKEN_CACHE_DIR) in the build context (no download)
image:
	mkdir -p build/tiktoken
	cp $(TIKTOKEN_CACHE_DIR)/fb374d419588a4632f3f557e76b4b70aebbca790 $(TIKTOKEN_CACHE_DIR)/9b5ad71b2ce5302211f9c61530b329a4922fc6a4 build/tiktoken/
	docker build -t keel $(if $(EXTRAS),--build-arg EXTRAS=$(EXTRAS)) .

bench: dev
	$(BIN)/python bench/overhead.py

lint: dev
	$(BIN)/ruff check proxy tests bench
	$(BIN)/mypy proxy

clean:
	rm -rf $(VENV) .pytest_cache keel.db* build
