#!/bin/sh
# Install sm120 (the container entrypoint, `sm120 info` inside) into its own venv, from the
# hashed lock for the engine's Python. The engine's environment is only read: the script
# fails the build if the install changed any engine package.
#
# Usage: install-toolkit.sh ENGINE_PYTHON
#   ENGINE_PYTHON  the engine's interpreter (command or path); recorded as an absolute path
#                  in /opt/sm120/engine-python, which the entrypoint execs the engine with
set -eu

die() {
    echo "install-toolkit: $*" >&2
    exit 1
}

[ $# -eq 1 ] || die "usage: install-toolkit.sh ENGINE_PYTHON"
engine=$(command -v "$1") || die "the image has no engine interpreter '$1'"
here=$(cd "$(dirname "$0")" && pwd)
root=/opt/sm120
venv=$root/venv
version=$("$engine" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
lock=$here/py$version.lock
[ -f "$lock" ] || die "no toolkit lock for Python $version: run 'sm120 build RECIPE --lock'"

# What the engine's interpreter sees, package by package (no pip needed in the engine).
inventory() {
    "$engine" -c 'import importlib.metadata as m
print("\n".join(sorted("%s==%s" % (d.metadata["Name"], d.version) for d in m.distributions())))'
}

before=$(inventory)
# A venv of the engine's interpreter without its site-packages: the toolkit sees none of the
# engine's packages and the engine none of the toolkit's.
"$engine" -m venv "$venv" || die "cannot make a venv with $engine (install python$version-venv)"
"$venv/bin/python" -m pip install --disable-pip-version-check --no-deps --require-hashes \
    --only-binary :all: -r "$lock"
# sm120 itself runs from its sources in $root: no build step, no build dependencies.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
printf '%s\n' "$root" >"$site/sm120.pth"
printf '%s\n' "$engine" >"$root/engine-python"
after=$(inventory)
[ "$before" = "$after" ] || die "the toolkit install changed the engine's environment"
"$venv/bin/python" -c 'import sm120.plan.resolve, sm120.images.verify'
echo "install-toolkit: toolkit in $venv (Python $version), engine $engine untouched" >&2
