#!/usr/bin/env bash
# Installs a build tree into a scratch prefix and checks what an operator would run from it.
#   install_test.sh BUILD_DIR
# Exit 77 (skipped) only where systemd-analyze is absent, and only after the install checks.
set -euo pipefail
build="$1"
prefix="$(mktemp -d)"
trap 'rm -rf "$prefix"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$prefix.log" 2>&1 || { cat "$prefix.log"; fail "cmake --install"; }
rm -f "$prefix.log"

for bin in tessera tessera-coordinator tessera-worker; do
  [[ -x "$prefix/bin/$bin" ]] || fail "$prefix/bin/$bin was not installed"
  "$prefix/bin/$bin" --help >/dev/null || fail "$bin --help does not run from the install prefix"
done
# The CUDA module, where it is built, lies where an installed worker looks for it.
if [[ -e "$build/lib/tessera/libtessera_cuda.so" ]]; then
  [[ -f "$prefix/lib/tessera/libtessera_cuda.so" ]] || fail "libtessera_cuda.so is not under $prefix/lib/tessera"
fi

units="$prefix/lib/systemd/system"
for unit in tessera-coordinator.service tessera-worker@.service; do
  [[ -f "$units/$unit" ]] || fail "$units/$unit was not installed"
  if grep -q '@TESSERA_' "$units/$unit"; then fail "$unit keeps an unfilled @TESSERA_...@ placeholder"; fi
  grep -q "^ExecStart=$prefix/bin/tessera-" "$units/$unit" || fail "$unit does not start the installed binary"
  grep -q '^DynamicUser=yes' "$units/$unit" || fail "$unit does not run as a user of its own"
  grep -q '^NoNewPrivileges=yes' "$units/$unit" || fail "$unit lacks NoNewPrivileges"
  grep -q '^ProtectSystem=strict' "$units/$unit" || fail "$unit lacks ProtectSystem=strict"
  if grep -Eq '^ExecStart=.*--(join|admin)-token ' "$units/$unit"; then fail "$unit puts a secret on the command line"; fi
done
# The worker joins only accelerator groups this machine has: systemd refuses to start a unit
# that names a missing one (a node without udev has no `render`).
groups_line="$(grep '^SupplementaryGroups=' "$units/tessera-worker@.service")" || fail "the worker's unit names no SupplementaryGroups= line"
for group in ${groups_line#SupplementaryGroups=}; do
  getent group "$group" >/dev/null || fail "the worker's unit names group '$group', which this machine lacks"
done
for group in video render; do
  if getent group "$group" >/dev/null && ! grep -qw "$group" <<<"$groups_line"; then
    fail "the worker's unit leaves out group '$group', which this machine has"
  fi
done
# A package for other machines names the groups itself; a malformed list is refused.
TESSERA_ACCELERATOR_GROUPS="video render" cmake --install "$build" --prefix "$prefix/named" >"$prefix/named.log" 2>&1 ||
  { cat "$prefix/named.log"; fail "cmake --install with TESSERA_ACCELERATOR_GROUPS"; }
grep -qx 'SupplementaryGroups=video render' "$prefix/named/lib/systemd/system/tessera-worker@.service" ||
  fail "TESSERA_ACCELERATOR_GROUPS='video render' did not reach the worker's unit"
if TESSERA_ACCELERATOR_GROUPS='video;render' cmake --install "$build" --prefix "$prefix/bad" >"$prefix/bad.log" 2>&1; then
  fail "cmake --install took TESSERA_ACCELERATOR_GROUPS='video;render'"
fi
grep -q "TESSERA_ACCELERATOR_GROUPS='video;render': expected group names" "$prefix/bad.log" ||
  { cat "$prefix/bad.log"; fail "a malformed TESSERA_ACCELERATOR_GROUPS is not named in the error"; }
rm -rf "$prefix/named" "$prefix/bad" "$prefix/named.log" "$prefix/bad.log"

# Every flag a unit names, on its ExecStart= or in a comment that says to add it, is one its
# binary takes (other commands' flags, `cmake --install`, `systemctl enable --now` and the
# command line's, are left out).
for pair in tessera-coordinator.service:tessera-coordinator tessera-worker@.service:tessera-worker; do
  unit="${pair%%:*}" bin="${pair#*:}"
  help="$("$prefix/bin/$bin" --help 2>&1)"
  flags="$(sed -E 's/(^|[ `#])(cmake|systemctl|tessera) [^`]*/\1/g' "$units/$unit" | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u)" ||
    fail "$unit names no flag"
  for flag in $flags; do
    grep -qE -- "^ +$flag( |\$)" <<<"$help" || fail "$unit names $flag, which $bin --help does not list"
  done
done

grep -q '^StateDirectory=tessera' "$units/tessera-coordinator.service" || fail "the coordinator's state is not under StateDirectory="
# The revocation list is read in place by the daemon's own user: never from the root-only
# directory (mode 0700) that holds the TLS files it gets through LoadCredential=.
if grep -Eq -- '--tls-crl +/etc/tessera/(coordinator|workers)/' "$units/tessera-coordinator.service"; then
  fail "the coordinator's unit reads its revocation list from a directory its user cannot enter"
fi

if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP: systemd-analyze is not installed; the units were installed and checked by hand only" >&2
  exit 77
fi
# An instance of the template, as systemctl would make it.
cp "$units/tessera-worker@.service" "$prefix/tessera-worker@edge-01.service"
cp "$units/tessera-coordinator.service" "$prefix/tessera-coordinator.service"
cd "$prefix"
out="$(systemd-analyze verify --man=no ./tessera-coordinator.service ./tessera-worker@edge-01.service 2>&1)" ||
  { echo "$out"; fail "systemd-analyze verify refused a unit"; }
if [[ -n "$out" ]]; then echo "$out"; fail "systemd-analyze verify warned about a unit"; fi
# The exposure score (0 best, 10 worst): the coordinator needs no devices and no JIT; a
# worker opens accelerators and may JIT kernels, so it is allowed more.
systemd-analyze security --offline=yes --threshold=20 ./tessera-coordinator.service >/dev/null ||
  fail "the coordinator's unit is exposed above 2.0 (systemd-analyze security --offline=yes)"
systemd-analyze security --offline=yes --threshold=25 ./tessera-worker@edge-01.service >/dev/null ||
  fail "the worker's unit is exposed above 2.5 (systemd-analyze security --offline=yes)"
echo "installed into a scratch prefix; both units verified"
