"""Load the profile's native kernels with ctypes; the engine refuses to start without them."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass


class StartupError(RuntimeError):
    """The engine cannot serve: a kernel or a tune cache is missing or broken."""


@dataclass(frozen=True)
class LoadedKernel:
    path: str
    info: str  # "name@version", as the library reports it
    library: ctypes.CDLL


def load_kernels(paths: str) -> list[LoadedKernel]:
    """Load every library in the colon-separated ``paths`` (UNIBAKE_KERNELS)."""
    if not paths:
        raise StartupError("no kernels configured for this profile (UNIBAKE_KERNELS is empty)")
    loaded = []
    for path in paths.split(":"):
        if not os.path.isfile(path):
            raise StartupError(f"kernel {path} is missing")
        try:
            lib = ctypes.CDLL(path)
            lib.unibake_kernel_info.restype = ctypes.c_char_p
            info = lib.unibake_kernel_info().decode()
        except (OSError, AttributeError) as exc:
            raise StartupError(f"kernel {path} does not load: {exc}") from None
        loaded.append(LoadedKernel(path=path, info=info, library=lib))
    return loaded


def attention_score(kernels: list[LoadedKernel], q: list[float], k: list[float]) -> float:
    """Run the flash_attn kernel the profile loaded on two vectors."""
    lib = next((x.library for x in kernels if x.info.startswith("flash_attn@")), None)
    if lib is None:
        raise StartupError("no flash_attn kernel loaded")
    vec = ctypes.c_double * len(q)
    lib.flash_attn_score.restype = ctypes.c_double
    lib.flash_attn_score.argtypes = [vec, vec, ctypes.c_size_t]
    return lib.flash_attn_score(vec(*q), vec(*k), len(q))
