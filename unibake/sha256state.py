"""A sha256 whose state can be taken and given back: what lets a read back resume the decoded stream's
sha256 after bytes an earlier read back hashed (:mod:`unibake.framememo`), without decoding them again.

Written by hand, over OpenSSL's own ``SHA256_Init``/``SHA256_Update``/``SHA256_Final`` through ctypes, because
no library does it: ``hashlib`` copies a hash but never exposes its state, and ``rehash`` (the one package
that pickles hashlib's states) refuses OpenSSL 3 and reads CPython's private structures. ``SHA256_CTX`` is
OpenSSL's public, documented structure (``openssl/sha.h``), unchanged since 0.9.8; the functions are
deprecated in OpenSSL 3 but exported, and they run the same assembly (SHA-NI where the CPU has it) as
hashlib's sha256. ctypes lets go of the GIL during each call, as hashlib does.

Where no libcrypto with those functions loads, :data:`AVAILABLE` is False and callers use hashlib (a read
back then decodes every frame, as before).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib

STATE_SIZE = 112  # sizeof(SHA256_CTX): h[8], Nl, Nh, data[16], num, md_len (unsigned 32-bit each)


class _Ctx(ctypes.Structure):
    _fields_ = [("h", ctypes.c_uint32 * 8), ("Nl", ctypes.c_uint32), ("Nh", ctypes.c_uint32),
                ("data", ctypes.c_uint32 * 16), ("num", ctypes.c_uint32), ("md_len", ctypes.c_uint32)]


def _library():
    """libcrypto: first by the names OpenSSL 3 and 1.1 give it (the one hashlib loaded is then found at once),
    else as ctypes searches (which runs ``ldconfig``, some 20-40 ms)."""
    for name in ("libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.3.dylib", "libcrypto.1.1.dylib"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    name = ctypes.util.find_library("crypto")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _load():
    """libcrypto's SHA256 functions, checked against hashlib once; None where they are missing or differ."""
    lib = _library()
    try:
        init, update, final = lib.SHA256_Init, lib.SHA256_Update, lib.SHA256_Final
    except AttributeError:  # (no library: None has none of them either)
        return None
    init.argtypes, init.restype = [ctypes.POINTER(_Ctx)], ctypes.c_int
    update.argtypes, update.restype = [ctypes.POINTER(_Ctx), ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int
    final.argtypes, final.restype = [ctypes.c_char_p, ctypes.POINTER(_Ctx)], ctypes.c_int
    if ctypes.sizeof(_Ctx) != STATE_SIZE:
        return None
    probe = b"unibake" * 100  # (a structure of another layout would give another digest, or none)
    ctx, out = _Ctx(), ctypes.create_string_buffer(32)
    if not (init(ctypes.byref(ctx)) and update(ctypes.byref(ctx), probe, len(probe)) and final(out, ctypes.byref(ctx))):
        return None
    return (init, update, final) if out.raw == hashlib.sha256(probe).digest() else None


_FUNCTIONS = _load()
AVAILABLE = _FUNCTIONS is not None


class StateError(ValueError):
    """A state that is not a sha256's state after the number of bytes it is said to follow."""


class Sha256:
    """hashlib's sha256 interface (``update``, ``digest``, ``hexdigest``, ``copy``), plus :meth:`state` and
    :meth:`restore`: the state after ``n`` bytes, and this hash put in a state taken elsewhere."""

    name = "sha256"
    digest_size = 32

    def __init__(self, data: bytes = b""):
        if _FUNCTIONS is None:
            raise RuntimeError("no libcrypto with SHA256_Init here: use hashlib")
        self._ctx = _Ctx()
        _FUNCTIONS[0](ctypes.byref(self._ctx))
        self.length = 0  # bytes hashed (or restored to)
        if data:
            self.update(data)

    def update(self, data) -> None:
        if not isinstance(data, bytes):
            data = bytes(data)  # (c_char_p takes bytes without a copy; other buffers are copied)
        _FUNCTIONS[1](ctypes.byref(self._ctx), data, len(data))
        self.length += len(data)

    def copy(self) -> "Sha256":
        other = Sha256.__new__(Sha256)
        other._ctx = _Ctx.from_buffer_copy(self._ctx)
        other.length = self.length
        return other

    def digest(self) -> bytes:
        ctx, out = _Ctx.from_buffer_copy(self._ctx), ctypes.create_string_buffer(32)
        _FUNCTIONS[2](out, ctypes.byref(ctx))
        return out.raw

    def hexdigest(self) -> str:
        return self.digest().hex()

    def state(self) -> bytes:
        """The state after the bytes hashed so far (``STATE_SIZE`` bytes, OpenSSL's ``SHA256_CTX``)."""
        return bytes(self._ctx)

    def restore(self, state: bytes, length: int) -> None:
        """Put this hash in ``state``, taken after ``length`` bytes. Its counters must say ``length`` bytes and
        the digest size sha256's: OpenSSL writes into the structure's block at the offset it holds, so a state
        whose offset is out of its block is never given to it."""
        if len(state) != STATE_SIZE:
            raise StateError(f"a sha256 state is {STATE_SIZE} bytes, not {len(state)}")
        ctx = _Ctx.from_buffer_copy(state)
        bits = length * 8
        if (ctx.Nl, ctx.Nh, ctx.num, ctx.md_len) != (bits & 0xFFFFFFFF, bits >> 32 & 0xFFFFFFFF, length % 64, 32) \
                or length < 0 or bits >> 64:
            raise StateError(f"the sha256 state is not one after {length} bytes")
        self._ctx, self.length = ctx, length
