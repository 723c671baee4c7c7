#!/usr/bin/env bash
# Fail unless the chart's copy of the CRDs (charts/sessionmem/crds/) is byte-identical to their one
# source of truth, the top-level crds/ folder: same file names, same bytes. Fix with tools/sync-crds.sh.
#
#   tools/check-crds.sh [SOURCE_DIR [CHART_CRD_DIR]]     exit 0: in sync, 1: they differ, 2: usage
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="${1:-$root/crds}"
dst="${2:-$root/charts/sessionmem/crds}"

[[ -d "$src" ]] || { echo "check-crds: no source folder $src" >&2; exit 2; }
shopt -s nullglob
sources=("$src"/*.yaml)
(( ${#sources[@]} )) || { echo "check-crds: no *.yaml in $src" >&2; exit 2; }

problems=0
for file in "${sources[@]}"; do
    copy="$dst/$(basename "$file")"
    if [[ ! -e "$copy" ]]; then
        echo "check-crds: $copy is missing (source: $file)" >&2
        problems=$((problems + 1))
    elif ! cmp -s "$file" "$copy"; then
        echo "check-crds: $copy differs from $file:" >&2
        diff -u "$file" "$copy" | head -n 40 >&2 || true
        problems=$((problems + 1))
    fi
done
for copy in "$dst"/*.yaml "$dst"/*.yml; do
    if [[ ! -e "$src/$(basename "$copy")" ]]; then
        echo "check-crds: $copy has no source in $src" >&2
        problems=$((problems + 1))
    fi
done
if (( problems )); then
    echo "check-crds: $problems problem(s); run tools/sync-crds.sh to copy $src into $dst" >&2
    exit 1
fi
echo "check-crds: $dst matches $src (${#sources[@]} file(s))"
