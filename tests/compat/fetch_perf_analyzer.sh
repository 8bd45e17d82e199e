#!/usr/bin/env bash
# Triton's perf_analyzer (PyPI wheel perf-analyzer 2.60.0), set up for tests/compat/test_perf_analyzer.py
# before the suite runs (tests/system_packages.sh calls this; the tests install nothing).
#
# The wheel's binary needs glibc 2.38 and Debian 12 has 2.36, so pip on this machine takes only an
# empty placeholder of the package. Here the real wheel is downloaded for its platform and the binary
# runs unchanged through the C library of Debian's next release (libc6, libstdc++6, libgcc-s1),
# unpacked beside it: nothing is installed system-wide. Writes "$DIR/perf_analyzer", a script that
# runs it, and changes nothing when that already works. DIR: $1, or the default below.
set -euo pipefail
DIR="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/tensorgate-tests/perf-analyzer}"
VERSION=2.60.0
RUN="$DIR/perf_analyzer"
say() { echo "fetch_perf_analyzer.sh: $*" >&2; }

if [ -x "$RUN" ] && "$RUN" --version >/dev/null 2>&1; then exit 0; fi
mkdir -p "$DIR"
python="${PYTHON:-python3}"
binary="$DIR/wheel/perf_analyzer/bin/perf_analyzer"
if [ ! -x "$binary" ]; then
  rm -rf "$DIR/download" && mkdir -p "$DIR/download"
  "$python" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_38_x86_64 \
    --python-version 3.11 -d "$DIR/download" "perf-analyzer==$VERSION" >&2
  wheel=$(ls "$DIR"/download/perf_analyzer-"$VERSION"-*.whl)
  "$python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$wheel" "$DIR/wheel"
  chmod +x "$binary"
fi
if "$binary" --version >/dev/null 2>&1; then  # a C library new enough already
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$binary" > "$RUN"
  chmod +x "$RUN"
  exit 0
fi
libs="$DIR/libc/usr/lib/x86_64-linux-gnu"
if [ ! -e "$libs/ld-linux-x86-64.so.2" ]; then
  apt="$DIR/apt"
  mkdir -p "$apt/parts" "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs" "$DIR/libc"
  # The machine's own Debian mirror, with the suite of the next release.
  mirror=$(grep -h -m1 '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' || true)
  [ -n "$mirror" ] || mirror=$(grep -h -m1 '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' || true)
  [ -n "$mirror" ] || { say "no Debian mirror in /etc/apt"; exit 2; }
  printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$mirror" > "$apt/parts/next.sources"
  options=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt/parts"
           -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o APT::Architecture=amd64)
  apt-get "${options[@]}" -qq update >&2
  (cd "$apt/debs" && apt-get "${options[@]}" -qq download libc6 libstdc++6 libgcc-s1 >&2)
  for deb in "$apt"/debs/*.deb; do dpkg -x "$deb" "$DIR/libc"; done
fi
printf '#!/bin/sh\nexec "%s" --library-path "%s:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu" "%s" "$@"\n' \
  "$libs/ld-linux-x86-64.so.2" "$libs" "$binary" > "$RUN"
chmod +x "$RUN"
"$RUN" --version >/dev/null
