#!/usr/bin/env bash
# Copy the CRDs from their one source of truth, the top-level crds/ folder, into the chart
# (charts/sessionmem/crds/): Helm only reads files inside the chart. Removes chart copies whose source
# is gone. Run it after regenerating crds/ (`python -m sessionmem_operator.crds --write crds`);
# tools/check-crds.sh (and tests/test_chart_lint.py) fails while the two differ.
#
#   tools/sync-crds.sh [SOURCE_DIR [CHART_CRD_DIR]]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="${1:-$root/crds}"
dst="${2:-$root/charts/sessionmem/crds}"

[[ -d "$src" ]] || { echo "sync-crds: no source folder $src" >&2; exit 2; }
shopt -s nullglob
sources=("$src"/*.yaml)
(( ${#sources[@]} )) || { echo "sync-crds: no *.yaml in $src" >&2; exit 2; }

mkdir -p "$dst"
for copy in "$dst"/*.yaml; do
    [[ -e "$src/$(basename "$copy")" ]] || { rm -f "$copy"; echo "sync-crds: removed stale $copy" >&2; }
done
for file in "${sources[@]}"; do
    target="$dst/$(basename "$file")"
    if ! cmp -s "$file" "$target"; then
        cp "$file" "$target.tmp.$$"
        mv -f "$target.tmp.$$" "$target"
        echo "sync-crds: updated $target" >&2
    fi
done
