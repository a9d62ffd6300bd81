#!/bin/sh
# Rebuild the prebuilt wheel a vendor would hand over: compile src/demo_quant.c in the builder image,
# then pack it with src/__init__.py as a wheel, with fixed times so the same source gives the same file.
# Usage: images/prebuilt/make-wheel.sh   (then: python build.py lock)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
version=1.0.0+cpu
docker run --rm --network none -v "$here/src:/src:ro" -v "$here:/out" localhost/unibake-demo-builder:bookworm \
  cc -O2 -shared -fPIC -ffile-prefix-map=/src=. "-DUNIBAKE_KERNEL_VERSION=\"$version\"" \
     -o /out/libdemo_quant.so /src/demo_quant.c
python3 - "$here" "$version" <<'PY'
import base64, hashlib, os, sys, zipfile
here, version = sys.argv[1], sys.argv[2]
name = f"demo_quant-{version}"
files = {"demo_quant/__init__.py": open(f"{here}/src/__init__.py", "rb").read(),
         "demo_quant/libdemo_quant.so": open(f"{here}/libdemo_quant.so", "rb").read(),
         f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: demo_quant\nVersion: {version}\n".encode(),
         f"{name}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: make-wheel.sh\nRoot-Is-Purelib: false\n"
                                    b"Tag: py3-none-linux_x86_64\n"}
record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                 for p, d in files.items()) + f"{name}.dist-info/RECORD,,\n"
files[f"{name}.dist-info/RECORD"] = record.encode()
with zipfile.ZipFile(f"{here}/{name}-py3-none-linux_x86_64.whl", "w", zipfile.ZIP_DEFLATED) as zf:
    for path, data in files.items():
        info = zipfile.ZipInfo(path, date_time=(2024, 1, 1, 0, 0, 0))
        info.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, data)
PY
rm -f "$here/libdemo_quant.so"
