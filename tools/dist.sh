#!/usr/bin/env bash
# The release files, into OUT (`make dist`): the sdist, the wheel built from it, and where that
# wheel is compiled (mypyc, with a C compiler at hand: it serves one CPython on one platform) a
# pure-Python wheel beside it, py3-none-any, that installs anywhere. pip takes the compiled wheel
# where its tags match and the pure one elsewhere.
#
#   tools/dist.sh OUT [PYTHON]
#
# Every wheel is built from the sdist, never from the checkout: setup.py builds in place, and a
# build in the checkout would replace the compiled modules of its editable install.
set -euo pipefail

out=${1:?usage: tools/dist.sh OUT [PYTHON]}
python=${2:-python3}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

mkdir -p "$out"
out=$(cd "$out" && pwd)
# With neither --sdist nor --wheel, build makes the sdist and then the wheel from it; compiled,
# whatever build the checkout holds.
nice env -u TENSORGATE_PURE_PYTHON "$python" -m build --outdir "$out" "$root"

wheels=("$out"/tensorgate-*.whl)
[ ${#wheels[@]} -eq 1 ] || { echo "dist.sh: expected one wheel in $out, found ${wheels[*]}" >&2; exit 1; }
case "${wheels[0]}" in
  *-py3-none-any.whl) exit 0 ;; # already pure
esac

sdists=("$out"/tensorgate-*.tar.gz)
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
tar -xzf "${sdists[0]}" -C "$unpacked"
TENSORGATE_PURE_PYTHON=1 nice "$python" -m build --wheel --outdir "$out" "$unpacked"/tensorgate-*
