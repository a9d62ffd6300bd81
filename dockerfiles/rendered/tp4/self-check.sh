#!/bin/sh
# Rendered by unibake for demo-llm:1.3.1-tp4: do not edit by hand.
# The fail-closed checks of one profile; the entrypoint runs it with the profile's environment:
#   docker run --rm -e PROFILE=<name> IMAGE self-check
# Exits 0 only if every check passes; each failure prints one "error:" line naming the check and file.
set -u
profile=${1:?usage: self-check.sh PROFILE}
failed=0
fail() { printf 'error: self-check[%s]: %s\n' "$profile" "$*" >&2; failed=1; }
pass() { printf 'self-check[%s]: ok: %s\n' "$profile" "$*"; }
cd /opt/unibake || { fail "install root /opt/unibake is missing"; exit 1; }

# the image's programs are linux/amd64 ones: uname -m says so natively and under emulation
machine=$(uname -m)
if [ "$machine" = x86_64 ]; then
  pass "platform linux/amd64 (uname -m: $machine)"
else
  fail "the image is for linux/amd64 (x86_64), but its programs run as $machine"
fi

# every baked file matches the ledgers written into the image (--skip-ledgers: the build checked them
# with another profile's checks, in the same RUN step)
case "${2:-}" in
  "") ;;
  --skip-ledgers) pass "file ledgers not checked again (--skip-ledgers)" ;;
  *) fail "unknown option $2 (self-check [--skip-ledgers])"; exit 1 ;;
esac
if [ "${2:-}" != --skip-ledgers ]; then
# A first look with the image's python3, if it has one: its hashlib (OpenSSL) hashes a big library several
# times faster than coreutils' sha256sum, which uses no SHA instructions. It only ever answers "every file
# matches", and only for a ledger of plain lines ("HASH  PATH": lowercase hex, no backslash, no CR, not "-",
# the last line ended); on anything else it answers no and sha256sum -c gives the verdict and the message.
sha256_all_match() {
  command -v python3 >/dev/null 2>&1 || return 1
  python3 -c '
import hashlib, re, sys
count = 0
with open(sys.argv[1], "rb") as ledger:
    for line in ledger:
        plain = re.fullmatch(rb"([0-9a-f]{64})  ([^\\\r\n]+)\n", line)
        if plain is None or plain.group(2) == b"-":
            sys.exit(1)
        digest = hashlib.sha256()
        with open(plain.group(2), "rb") as data:
            for block in iter(lambda: data.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest().encode() != plain.group(1):
            sys.exit(1)
        count += 1
sys.exit(0 if count else 1)
' "$1" >/dev/null 2>&1
}
if [ ! -f meta/files.sha256 ]; then
  fail "ledger meta/files.sha256 is missing"
elif sha256_all_match meta/files.sha256 || out=$(sha256sum -c meta/files.sha256 2>&1); then
  pass "$(grep -c . meta/files.sha256) files match meta/files.sha256"
else
  fail "files differ from meta/files.sha256: $(printf '%s\n' "$out" | grep -v ': OK$' | head -n 5 | tr '\n' ' ')"
fi
if [ ! -f meta/kernels.sha256 ]; then
  fail "ledger meta/kernels.sha256 is missing"
elif sha256_all_match meta/kernels.sha256 || out=$(sha256sum -c meta/kernels.sha256 2>&1); then
  pass "$(grep -c . meta/kernels.sha256) files match meta/kernels.sha256"
else
  fail "files differ from meta/kernels.sha256: $(printf '%s\n' "$out" | grep -v ': OK$' | head -n 5 | tr '\n' ' ')"
fi
if [ ! -f meta/overlays.sha256 ]; then
  fail "ledger meta/overlays.sha256 is missing"
elif sha256_all_match meta/overlays.sha256 || out=$(sha256sum -c meta/overlays.sha256 2>&1); then
  pass "$(grep -c . meta/overlays.sha256) files match meta/overlays.sha256"
else
  fail "files differ from meta/overlays.sha256: $(printf '%s\n' "$out" | grep -v ': OK$' | head -n 5 | tr '\n' ' ')"
fi
fi

# the profile's tune caches: fail-closed count
if [ -n "${UNIBAKE_TUNE_EXPECT:-}" ]; then
  found=$(find "$UNIBAKE_TUNE_DIR" -maxdepth 1 -type f -name '*.json' 2>/dev/null | wc -l)
  if [ "$found" -eq "$UNIBAKE_TUNE_EXPECT" ]; then
    pass "$found tune-cache JSON files in $UNIBAKE_TUNE_DIR"
  else
    fail "tune caches: expected $UNIBAKE_TUNE_EXPECT JSON files in $UNIBAKE_TUNE_DIR, found $found"
  fi
fi

# the profile's kernels load, and the engine's Python compiles
if ! command -v python3 >/dev/null 2>&1; then
  fail "python3 is not in the image; it is needed to load kernels and compile the engine"
else
  if [ -n "$UNIBAKE_KERNELS" ]; then
    # shellcheck disable=SC2086
    if out=$(IFS=:; python3 -c '
import ctypes, sys
for path in sys.argv[1:]:
    try:
        ctypes.CDLL(path)
    except OSError as exc:
        print("kernel %s does not load: %s" % (path, exc))
        sys.exit(1)
print(len(sys.argv) - 1)
' $UNIBAKE_KERNELS 2>&1); then
      pass "$out kernels load ($UNIBAKE_KERNELS)"
    else
      fail "$out"
    fi
  fi
  if out=$(python3 -c '
import os, sys
count = 0
for folder, dirs, files in os.walk(sys.argv[1]):
    dirs.sort()
    for name in sorted(files):
        if not name.endswith(".py"):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as fh:
                compile(fh.read(), path, "exec", dont_inherit=True)
        except (OSError, SyntaxError, ValueError) as exc:
            print("python %s does not compile: %s" % (path, exc))
            sys.exit(1)
        count += 1
print(count)
' /opt/unibake/engine 2>&1); then
    pass "$out Python files of the engine compile"
  else
    fail "$out"
  fi
fi

if [ "$failed" -ne 0 ]; then
  exit 1
fi
pass "all checks passed"
