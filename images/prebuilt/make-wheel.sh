#!/bin/sh
# Rebuild the prebuilt wheels a vendor would hand over, one per CPU: compile src/demo_quant.c in the
# builder image of each platform (arm64 under emulation), then pack it with src/__init__.py as a
# wheel, with fixed times so the same source gives the same file.
# Usage: images/prebuilt/make-wheel.sh [amd64] [arm64]   (default: both; then: python build.py lock)
# CC_HOST=aarch64-linux-gnu-gcc make-wheel.sh arm64: compile with the host's (cross) compiler instead.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
version=1.0.0+cpu
for arch in ${*:-amd64 arm64}; do
  case $arch in
    amd64) image=localhost/unibake-demo-builder:bookworm; tag=linux_x86_64 ;;
    arm64) image=localhost/unibake-demo-builder:bookworm-arm64; tag=linux_aarch64 ;;
    *) echo "error: make-wheel.sh: unknown architecture $arch (amd64 or arm64)" >&2; exit 2 ;;
  esac
  if [ -n "${CC_HOST:-}" ]; then
    "$CC_HOST" -O2 -shared -fPIC -ffile-prefix-map="$here/src"=. "-DUNIBAKE_KERNEL_VERSION=\"$version\"" \
      -o "$here/libdemo_quant.so" "$here/src/demo_quant.c"
  else
    docker run --rm --network none -v "$here/src:/src:ro" -v "$here:/out" "$image" \
      cc -O2 -shared -fPIC -ffile-prefix-map=/src=. "-DUNIBAKE_KERNEL_VERSION=\"$version\"" \
         -o /out/libdemo_quant.so /src/demo_quant.c
  fi
  python3 - "$here" "$version" "$tag" <<'PY'
import base64, hashlib, os, sys, zipfile
here, version, tag = sys.argv[1], sys.argv[2], sys.argv[3]
name = f"demo_quant-{version}"
files = {"demo_quant/__init__.py": open(f"{here}/src/__init__.py", "rb").read(),
         "demo_quant/libdemo_quant.so": open(f"{here}/libdemo_quant.so", "rb").read(),
         f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: demo_quant\nVersion: {version}\n".encode(),
         f"{name}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: make-wheel.sh\nRoot-Is-Purelib: false\n"
                                    + f"Tag: py3-none-{tag}\n".encode()}
record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                 for p, d in files.items()) + f"{name}.dist-info/RECORD,,\n"
files[f"{name}.dist-info/RECORD"] = record.encode()
with zipfile.ZipFile(f"{here}/{name}-py3-none-{tag}.whl", "w", zipfile.ZIP_DEFLATED) as zf:
    for path, data in files.items():
        info = zipfile.ZipInfo(path, date_time=(2024, 1, 1, 0, 0, 0))
        info.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, data)
PY
  rm -f "$here/libdemo_quant.so"
done
