#!/usr/bin/env bash
# Installs every Debian package reprise needs to build and test. Safe to re-run.
set -euo pipefail
PKGS=(build-essential cmake ninja-build ccache pkg-config
      nlohmann-json3-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev
      libcli11-dev libcpp-httplib-dev libpng-dev libjpeg62-turbo-dev libwebp-dev
      libfmt-dev libicu-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Node.js + npm are only needed for the OpenAI-client test; the machine image may ship its own build.
if ! command -v npm >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm || true
fi
