#!/usr/bin/env bash
# Builds msgspec from a source checkout for a Python that cannot install it
# (no PyPI, and Debian 12 does not package it), for the Python anchors of
# .ci/perf: the golden vectors' check, msgspec's encode and decode times,
# and the reference's sessions.
#
#   build_msgspec.sh SRC OUT [PYTHON]
#
# SRC is a checkout of github.com/jcrist/msgspec, OUT a directory to put
# the package in, PYTHON (default /usr/bin/python3) the interpreter it is
# for; it needs gcc and that Python's headers (Debian: python3-dev). It
# prints the PYTHONPATH to use:
#
#   export PYTHONPATH=$(testdata/python/build_msgspec.sh ~/src/msgspec /tmp/msgspec)
set -euo pipefail
src=${1:?usage: build_msgspec.sh SRC OUT [PYTHON]}
out=${2:?usage: build_msgspec.sh SRC OUT [PYTHON]}
py=${3:-/usr/bin/python3}
mkdir -p "$out"
out=$(cd "$out" && pwd) # printed for PYTHONPATH, which tests read from other directories
rm -rf "$out/msgspec"
cp -r "$src/src/msgspec" "$out/msgspec"
inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
gcc -O2 -g0 -DNDEBUG -fwrapv -fPIC -shared -I"$inc" "$out/msgspec/_core.c" -o "$out/msgspec/_core$ext" -lm
# A release's version file is written by its build backend from git tags.
[ -e "$out/msgspec/_version.py" ] || echo "__version__ = \"$(git -C "$src" describe --tags --always 2>/dev/null || echo source)\"" >"$out/msgspec/_version.py"
PYTHONPATH=$out "$py" -c 'import msgspec; msgspec.msgpack.encode(1)' >&2
echo "$out"
