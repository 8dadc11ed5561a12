#!/usr/bin/env bash
# Checks kernels/gemv_quant.cu on the host, no GPU needed (see host_sim.cpp): dumps repacked
# random matrices and their yomi-cpu dequantization, compiles the kernel file with g++ and
# shims, and runs every kernel against them.
set -euo pipefail
cd "$(dirname "$0")/../../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
YOMI_HOST_SIM_DIR="$dir" cargo test -q -p yomi-cuda --lib host_sim_dump -- --ignored >/dev/null
g++ -std=c++17 -O1 -w -DKERNEL_FILE="\"$PWD/crates/yomi-cuda/kernels/gemv_quant.cu\"" \
  -o "$dir/host_sim" crates/yomi-cuda/tools/host_sim.cpp
"$dir/host_sim" "$dir"
