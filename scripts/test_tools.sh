#!/usr/bin/env bash
# The outside tools `make test` needs, checked and installed before any test runs:
# iproute2's `ss` (sockets in flight during a drain), Debian's headless Chromium (renders
# the status page) and its chromedriver (selenium drives the labelling page). Nothing is
# downloaded but Debian's packages. Without root (or sudo) it names the command to run
# first and exits 1, so a fresh machine never reaches a test that would fail for want of
# a tool. `make test` and .ci/run both call it.
set -euo pipefail
missing=()
command -v ss >/dev/null 2>&1 || missing+=(iproute2)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
  || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
[ "${#missing[@]}" -eq 0 ] && exit 0
install=(apt-get install -y -qq --no-install-recommends "${missing[@]}")
if [ "$(id -u)" = 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "make test needs ${missing[*]} (Debian packages); run first: sudo apt-get update && sudo ${install[*]}" >&2
  exit 1
fi
echo "installing the suite's tools: ${missing[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" "${install[@]}" >/dev/null
