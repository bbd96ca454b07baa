#!/usr/bin/env bash
# check-module-symbols.sh MODULE LOADED_BY EXECUTABLE...
#
# A backend module (base/backend_module.h) leaves Tessera's own symbols undefined and takes
# them from the executable that loads it. This checks, without loading anything, that every
# EXECUTABLE holding the module's loader (a function whose demangled signature starts with
# LOADED_BY, e.g. "tessera::CudaViability(") exports every symbol the module needs that none
# of the module's own libraries defines. An executable without the loader is passed over.
# Exit 0 when all fit; 1 naming each executable and (up to 10 of) the symbols it lacks.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 MODULE LOADED_BY EXECUTABLE..." >&2; exit 2; }
module="$1"; loaded_by="$2"; shift 2

dynamic_defined() { nm -D --defined-only "$@" 2>/dev/null | awk 'NF >= 3 { sub(/@.*/, "", $3); print $3 }'; }

undefined="$(nm -D --undefined-only "$module" | awk '$1 == "U" { sub(/@.*/, "", $2); print $2 }' | sort -u)"
linked="$(ldd "$module")"
libraries="$(awk '$2 == "=>" && $3 ~ /^\// { print $3 }' <<< "$linked")"
if grep -q 'not found' <<< "$linked"; then
  echo "$module: a library it needs is not found here:"; grep 'not found' <<< "$linked"; exit 1
fi
# shellcheck disable=SC2086
provided="$(dynamic_defined $libraries | sort -u)"
needed="$(comm -23 <(echo "$undefined") <(echo "$provided"))"
echo "$(basename "$module"): $(echo "$needed" | grep -c . || true) symbols to come from the executable"

failed=0 checked=0
for executable in "$@"; do
  # grep -c reads everything: an early exit would fail nm with SIGPIPE under pipefail.
  holds="$(nm -C --defined-only "$executable" 2>/dev/null | grep -cF " $loaded_by" || true)"
  [ "${holds:-0}" -gt 0 ] || continue
  checked=$((checked + 1))
  missing="$(comm -23 <(echo "$needed") <(dynamic_defined "$executable" | sort -u))"
  if [ -n "$missing" ]; then
    failed=1
    echo "FAIL $executable does not export $(echo "$missing" | wc -l) symbols $(basename "$module") needs:"
    echo "$missing" | head -10 | c++filt | sed 's/^/  /'
  else
    echo "ok   $executable"
  fi
done
[ "$checked" -gt 0 ] || { echo "no executable holds $loaded_by: nothing loads $(basename "$module")?"; exit 1; }
exit $failed
