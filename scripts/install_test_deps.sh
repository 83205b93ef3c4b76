#!/usr/bin/env bash
# What the test suite needs beyond pip: headless Chromium for the dashboard page test
# (tests/entrypoints/browser_utils.py). Debian/Ubuntu: installed with apt-get (sudo when not root).
set -euo pipefail
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "The dashboard test needs headless Chromium: install it (a 'chromium' or 'chromium-browser'" \
         "on PATH), then rerun." >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium
