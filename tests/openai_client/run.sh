#!/usr/bin/env bash
# Runs the official `openai` and `@anthropic-ai/sdk` npm clients against `reprise serve` on the
# stories260K fixture (skips with a message when ../shared is absent).
#   bash tests/openai_client/run.sh [path/to/reprise]
# The binary defaults to $REPRISE_BIN, then build/reprise (scripts/build.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bin="${1:-${REPRISE_BIN:-$repo/build/reprise}}"
if [ ! -f "$repo/../shared/fixtures/models/stories260K.gguf" ]; then
  echo "SKIP: ../shared/fixtures/models/stories260K.gguf not found: OpenAI client test skipped"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "npm is required for the OpenAI client test (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
if [ ! -x "$bin" ]; then
  echo "reprise binary not found at $bin (build it, or pass its path)" >&2
  exit 1
fi
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"  # absolute: the test runs from here
cd "$here"
npm ci --no-audit --no-fund --loglevel=error
REPRISE_BIN="$bin" node --test --test-concurrency=1 openai_client.test.mjs anthropic_client.test.mjs
