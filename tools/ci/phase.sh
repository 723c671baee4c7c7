#!/usr/bin/env bash
# phase.sh NAME COMMAND...: runs COMMAND and prints how long it took, so a slow CI run says where the time went.
# The line goes to stderr, tagged for grep: `[phase] NAME: 123s (exit 0)`. COMMAND's exit code is kept.
set -u
name="$1"
shift
start=$(date +%s)
"$@"
rc=$?
printf '[phase] %s: %ss (exit %s)\n' "$name" "$(($(date +%s) - start))" "$rc" >&2
exit "$rc"
