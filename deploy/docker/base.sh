#!/usr/bin/env bash
# A local stand-in for python:3.11-slim-bookworm, for machines that reach Debian's packages and
# PyPI but no image registry: Debian bookworm (minbase) with CPython 3.11, venv and the CA
# certificates, made with debootstrap from this machine's own Debian mirror and written as a tar
# file that `docker import` takes.
#
#   base.sh OUT.tar
#
# Run as root on a Debian machine (image.sh runs it, and installs debootstrap first). The tar file
# carries what this machine needs to reach the package indexes, so that apt and pip inside a build
# on this base work as they do here:
#   - its apt sources (so also its updates and security suites) and the apt settings no Debian
#     package installed (this machine's own);
#   - the certificate authorities it trusts beyond Debian's (a machine that reaches PyPI through
#     an intercepting proxy trusts that proxy's CA), added as local certificates, so they survive
#     a later update of ca-certificates;
#   - a pip configuration that uses the system's CA bundle (pip otherwise trusts only its own
#     copy of certifi), and this machine's index URL where it sets one.
# An image built on this base therefore trusts this machine's CAs: it is for testing here, not to
# be pushed anywhere.
set -euo pipefail

out=${1:?usage: base.sh OUT.tar}
suite=bookworm

mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  for sources in /etc/apt/sources.list.d/*.sources; do
    [ -f "$sources" ] || continue
    mirror=$(awk '/^URIs:/ { print $2; exit }' "$sources")
    [ -n "$mirror" ] && break
  done
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk '$1 == "deb" && $3 == "'"$suite"'" { print $2; exit }' /etc/apt/sources.list)
fi
mirror=${mirror:-http://deb.debian.org/debian}

rootfs=$(mktemp -d "$(dirname "$out")/rootfs.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT
chmod 755 "$rootfs" # the image's /, which every user must traverse (mktemp made it 0700)

echo "base.sh: debootstrap $suite from $mirror" >&2
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$suite" "$rootfs" "$mirror" >&2

# apt as on this machine.
if compgen -G '/etc/apt/sources.list.d/*.sources' >/dev/null; then
  rm -f "$rootfs/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/*.sources "$rootfs/etc/apt/sources.list.d/"
elif [ -f /etc/apt/sources.list ]; then
  cp /etc/apt/sources.list "$rootfs/etc/apt/sources.list"
fi
for setting in /etc/apt/apt.conf.d/*; do
  [ -f "$setting" ] || continue
  dpkg -S "$setting" >/dev/null 2>&1 || cp "$setting" "$rootfs/etc/apt/apt.conf.d/"
done

# No documentation, manual pages or translations, now or in what a build installs later (as in
# Debian's own slim images); the copyright files stay.
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/tensorgate-slim" <<'EOF'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
EOF
find "$rootfs/usr/share/doc" -type f ! -name copyright -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$rootfs/usr/share/man/"* "$rootfs/usr/share/info/"* "$rootfs/usr/share/locale/"*

# This machine's certificate authorities that Debian's bundle lacks.
host_bundle=/etc/ssl/certs/ca-certificates.crt
if [ -f "$host_bundle" ]; then
  added=$(python3 - "$host_bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt" \
    "$rootfs/usr/local/share/ca-certificates" <<'EOF'
import re
import sys
from pathlib import Path

pem = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)
host, debian, out = (Path(arg) for arg in sys.argv[1:])
known = {"".join(block.split()) for block in pem.findall(debian.read_text())}
extra = [block for block in pem.findall(host.read_text()) if "".join(block.split()) not in known]
out.mkdir(parents=True, exist_ok=True)
for i, block in enumerate(extra):
    (out / f"host-{i:03d}.crt").write_text(block + "\n")
print(len(extra))
EOF
  )
  echo "base.sh: $added certificate authorities of this machine added" >&2
  chroot "$rootfs" update-ca-certificates >&2
fi

# pip: the system CA bundle, and this machine's index where it names one over http(s) (a file://
# index or find-links directory of this machine does not exist inside the image).
{
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n'
  index=${PIP_INDEX_URL:-$(python3 -m pip config get global.index-url 2>/dev/null || true)}
  case "$index" in
    http://* | https://*) printf 'index-url = %s\n' "$index" ;;
  esac
} >"$rootfs/etc/pip.conf"

# Up to date with the security suite, as the official images are when they are rebuilt.
DEBIAN_FRONTEND=noninteractive chroot "$rootfs" sh -euc \
  'apt-get update -q && apt-get upgrade -y -q && apt-get clean && rm -rf /var/lib/apt/lists/*' >&2

# Docker provides these at run time; this machine's own must not travel in the image.
: >"$rootfs/etc/resolv.conf"
rm -f "$rootfs/etc/hostname"

tar --numeric-owner --xattrs -C "$rootfs" -cf "$out.partial" .
mv "$out.partial" "$out"
