#!/usr/bin/env bash
# Fresh machine -> running model: installs dependencies, builds, and runs
# `reprise run`. With no arguments it uses a small synthetic model that reprise
# writes itself (offline, random weights); pass a GGUF to run a real model:
#   bash scripts/setup.sh -m path/to/model.gguf -p "Once upon a time"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if [ $# -eq 0 ]; then
  set -- -p "Once upon a time" -n 32 --verbose
fi
exec build/reprise run "$@"
