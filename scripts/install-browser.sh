#!/usr/bin/env bash
# Installs headless Chromium and its WebDriver from the OS packages, for the report pages' browser
# tests (tests/integration/test_report_browser.py); idempotent: skips when both are on PATH.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then exit 0; fi
if ! command -v apt-get >/dev/null; then
  echo "install-browser: no apt-get here; install chromium and chromedriver by hand (the browser tests skip without them)" >&2
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
command -v chromium >/dev/null && command -v chromedriver >/dev/null
