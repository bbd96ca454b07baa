# shellcheck shell=bash
# Shared by the unit confinement tests (sourced, not run): reads a systemd unit's confinement
# and checks an `strace -f` trace against it, as systemd would apply it:
#   - every system call is in the unit's SystemCallFilter= set (its lines applied in order, as
#     systemd does: an allow list, with @default always in it, then removals and additions);
#   - every socket() is of a family RestrictAddressFamilies= allows;
#   - under MemoryDenyWriteExecute=yes, no mprotect() adds PROT_EXEC and no mmap() asks for
#     PROT_WRITE|PROT_EXEC;
#   - under ProtectProc=invisible, nothing opens /proc/PID/ of a process outside the trace.
# The caller defines skip and fail, and calls confinement_preconditions before anything else.

confinement_preconditions() {
  command -v strace >/dev/null || skip "no strace (scripts/setup.sh installs it)"
  command -v systemd-analyze >/dev/null || skip "no systemd-analyze (Debian's systemd package)"
  strace -f -qq -o /dev/null true 2>/dev/null || skip "strace cannot trace processes here"
}

# expand NAME...: the system calls each name stands for, a @group expanded to its members.
expand() {
  local name member
  for name in "$@"; do
    if [[ $name == @* ]]; then
      # One member per indented line; nested groups are named, not expanded, so expand them here.
      for member in $(systemd-analyze syscall-filter "$name" </dev/null 2>/dev/null | awk '/^ +@?[a-z0-9_-]+$/ { print $1 }'); do
        expand "$member"
      done
    else
      echo "$name"
    fi
  done
}

# unit_allowed_calls UNIT: fills the associative array `allowed` with the calls UNIT's
# SystemCallFilter= lines allow.
declare -A allowed=()
unit_allowed_calls() {
  local unit=$1 line call
  local -a filters
  allowed=()
  mapfile -t filters < <(sed -n 's/^SystemCallFilter=//p' "$unit")
  ((${#filters[@]})) || fail "$unit has no SystemCallFilter= line"
  [[ ${filters[0]:0:1} != "~" ]] || fail "$unit's first SystemCallFilter= is a deny list; this test reads allow lists only"
  for call in $(expand @default); do allowed[$call]=1; done
  for line in "${filters[@]}"; do
    [[ -n $line ]] || fail "$unit has an empty SystemCallFilter=, which clears the filter; this test reads one list"
    if [[ $line == "~"* ]]; then
      # shellcheck disable=SC2086
      for call in $(expand ${line#"~"}); do unset "allowed[$call]"; done
    else
      # shellcheck disable=SC2086
      for call in $(expand $line); do allowed[$call]=1; done
    fi
  done
  ((${#allowed[@]} > 100)) || fail "the filter of $unit expanded to ${#allowed[@]} calls: systemd-analyze syscall-filter gave too little"
}

# traced_calls TRACE: the name of each kind of call in TRACE, from lines such as
# `1234 mbind(0x7f.., 134217728, MPOL_PREFERRED, NULL, 0, 0) = 0`.
traced_calls() {
  sed -nE 's/^[0-9]+ +([a-z0-9_]+)\(.*/\1/p' "$1" | sort -u
}

# check_trace TRACE UNIT WHAT: fails, listing each, where TRACE does what UNIT forbids; WHAT
# names the traced program in the messages. Calls unit_allowed_calls UNIT first.
check_trace() {
  local trace=$1 unit=$2 what=$3 call family families line pid
  local -a failures=()
  local -A traced_pids=()
  unit_allowed_calls "$unit"
  for call in $(traced_calls "$trace"); do
    [[ -n ${allowed[$call]:-} ]] || failures+=("system call $call: not in the unit's SystemCallFilter=")
  done
  families=$(sed -n 's/^RestrictAddressFamilies=//p' "$unit")
  while read -r family; do
    if [[ -n $families ]] && ! grep -qw "$family" <<<"$families"; then
      failures+=("socket family $family: not in the unit's RestrictAddressFamilies=")
    fi
  done < <(sed -nE 's/^[0-9]+ +socket\((AF_[A-Z0-9]+),.*/\1/p' "$trace" | sort -u)
  if grep -q '^MemoryDenyWriteExecute=yes' "$unit"; then
    while IFS= read -r line; do failures+=("under MemoryDenyWriteExecute=yes: $line"); done < <(
      grep -E '^[0-9]+ +(mprotect|pkey_mprotect)\([^)]*PROT_EXEC|^[0-9]+ +mmap\([^)]*(PROT_WRITE\|PROT_EXEC|PROT_EXEC\|PROT_WRITE)' "$trace" |
        sed -E 's/^[0-9]+ +//' | cut -c1-120 | sort -u)
  fi
  if grep -q '^ProtectProc=invisible' "$unit"; then
    while read -r pid; do traced_pids[$pid]=1; done < <(sed -nE 's/^([0-9]+) .*/\1/p' "$trace" | sort -u)
    for pid in $(grep -oE '"/proc/[0-9]+/' "$trace" | tr -dc '0-9\n' | sort -u); do
      [[ -n ${traced_pids[$pid]:-} ]] || failures+=("under ProtectProc=invisible: opens /proc/$pid/, another process's")
    done
  fi
  if ((${#failures[@]})); then
    printf '  %s\n' "${failures[@]}" >&2
    fail "$what does what $(basename "$unit") forbids: systemd would stop or kill it, or it would fail"
  fi
}
