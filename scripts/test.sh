#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test through CTest. Tests that
# need ../shared (the llama.cpp oracle) skip with a message when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 1200
