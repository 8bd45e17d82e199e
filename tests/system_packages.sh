#!/usr/bin/env bash
# The Debian programs the suite drives for real, installed before it runs (`make test` calls this;
# the tests themselves install nothing): nginx (tests/deploy/test_nginx.py), Chromium
# (tests/e2e/test_status_page.py), kubectl with kustomize (tests/deploy/test_kubernetes.py), espeak-ng
# (the speech tests/e2e/test_recognizer.py streams; synthetic audio without it), and Triton's
# perf_analyzer (tests/compat/fetch_perf_analyzer.sh).
# What is there already is left alone. Off Debian, or without root, it says so and does nothing:
# the tests that need a missing program then skip, saying which.
set -euo pipefail
# Triton's perf_analyzer, for tests/compat/test_perf_analyzer.py (in a cache of its own, not installed).
bash "$(dirname "$0")/compat/fetch_perf_analyzer.sh" || echo "tests/system_packages.sh: perf_analyzer not set up; its tests skip" >&2
missing=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
have nginx || missing+=(nginx)
have chromium || missing+=(chromium)
have kubectl || missing+=(kubectl)
have espeak-ng || missing+=(espeak-ng)
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
  echo "tests/system_packages.sh: not installing ${missing[*]} (needs Debian's apt-get and root); their tests skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
for package in "${missing[@]}"; do
  case "$package" in
    # Google's kubectl package where the machine's lists have it, else Debian's own client.
    kubectl) apt-get install -y -qq --no-install-recommends kubectl >/dev/null 2>&1 \
               || apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null ;;
    *) apt-get install -y -qq --no-install-recommends "$package" >/dev/null ;;
  esac
done
