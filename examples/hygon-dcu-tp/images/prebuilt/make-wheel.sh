#!/bin/sh
# Rebuild the prebuilt lmslim wheel (a stand-in for the vendor's): compile in the builder image, then pack
# it as a wheel with fixed times. Then: python build.py lock --config <this example>/profiles
set -eu
here=$(cd "$(dirname "$0")" && pwd)
version=0.2.1+das.dtk2504
docker run --rm --network none -v "$here/src:/src:ro" -v "$here:/out" localhost/unibake-demo-builder:bookworm \
  cc -O2 -shared -fPIC -ffile-prefix-map=/src=. -o /out/liblmslim.so /src/lmslim.c
python3 - "$here" "$version" <<'PY'
import base64, hashlib, sys, zipfile
here, version = sys.argv[1], sys.argv[2]
name = f"lmslim-{version}"
files = {"lmslim/__init__.py": open(f"{here}/src/__init__.py", "rb").read(),
         "lmslim/liblmslim.so": open(f"{here}/liblmslim.so", "rb").read(),
         f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: lmslim\nVersion: {version}\n".encode(),
         f"{name}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: make-wheel.sh\nRoot-Is-Purelib: false\n"
                                    b"Tag: cp311-cp311-linux_x86_64\n"}
record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                 for p, d in files.items()) + f"{name}.dist-info/RECORD,,\n"
files[f"{name}.dist-info/RECORD"] = record.encode()
with zipfile.ZipFile(f"{here}/{name}-cp311-cp311-linux_x86_64.whl", "w", zipfile.ZIP_DEFLATED) as zf:
    for path, data in files.items():
        info = zipfile.ZipInfo(path, date_time=(2024, 1, 1, 0, 0, 0))
        info.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, data)
PY
rm -f "$here/liblmslim.so"
