#!/bin/sh
# Apply the glm47 patch stack to an installed vLLM, then byte-compile every file it changed.
#
# Usage: apply-patches.sh [PATCH_DIR [SITE_DIR]]
#   PATCH_DIR  holds `series` and the .patch files (default: patches/ next to this script)
#   SITE_DIR   the directory that contains vllm/ (default: where $PYTHON finds vllm)
#   PYTHON     interpreter that owns the vllm install (default: python3)
#
# Every patch is dry-run first, so a patch lands whole or not at all; any hunk that does not
# apply exactly (no fuzz) exits non-zero and fails the image build.
set -eu

die() {
    echo "apply-patches: $*" >&2
    exit 1
}

here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
patch_dir=${1:-$here/patches}

if [ -n "${2:-}" ]; then
    site_dir=$2
else
    # find_spec locates the package without importing it (importing vllm pulls in torch).
    site_dir=$("$python" -c 'import importlib.util, os, sys
spec = importlib.util.find_spec("vllm")
if spec is None or not spec.submodule_search_locations:
    sys.exit("vllm is not installed for " + sys.executable)
print(os.path.dirname(list(spec.submodule_search_locations)[0]))') ||
        die "cannot locate the installed vllm package"
fi

[ -f "$patch_dir/series" ] || die "no series file in $patch_dir"
[ -d "$site_dir/vllm" ] || die "no vllm/ package under $site_dir"

applied=0
changed=""
while IFS= read -r entry || [ -n "$entry" ]; do
    case $entry in
        '' | '#'*) continue ;;
    esac
    file=$patch_dir/$entry
    [ -f "$file" ] || die "series names $entry, which is not in $patch_dir"
    echo "apply-patches: $entry" >&2
    # -r - discards reject files: a failed build should not leave *.rej in site-packages.
    if ! report=$(patch -d "$site_dir" -p1 --forward --batch --fuzz=0 --dry-run -r - <"$file"); then
        printf '%s\n' "$report" >&2
        die "$entry does not apply to $site_dir/vllm"
    fi
    patch -d "$site_dir" -p1 --forward --batch --fuzz=0 --no-backup-if-mismatch -r - <"$file" ||
        die "$entry failed while applying to $site_dir/vllm"
    changed="$changed $(sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$file")"
    applied=$((applied + 1))
done <"$patch_dir/series"

[ "$applied" -gt 0 ] || die "series in $patch_dir lists no patches"

cd "$site_dir"
# Paths come from the patches' +++ lines (no spaces), so word splitting is what is wanted.
# shellcheck disable=SC2086
"$python" -m py_compile $changed || die "a patched module does not compile"
echo "apply-patches: $applied patches applied, compiled:$changed" >&2
