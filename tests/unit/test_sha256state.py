"""The resumable sha256 gives hashlib's digests, and a state taken after some bytes, given to another hash,
goes on as if that one had hashed them; a state whose counters say another length is refused."""

from __future__ import annotations

import hashlib
import os

import pytest

from unibake.sha256state import AVAILABLE, STATE_SIZE, Sha256, StateError

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="no libcrypto with SHA256_Init on this machine")


@pytest.mark.parametrize("cuts", [(), (1,), (63, 64, 65), (1000, 4096 + 7), (200_000,)])
def test_its_digest_is_hashlib_s_however_the_bytes_come(cuts):
    data = os.urandom(300_000)
    ours, theirs, at = Sha256(), hashlib.sha256(), 0
    for cut in (*cuts, len(data)):
        ours.update(data[at:cut])
        theirs.update(memoryview(data)[at:cut])
        at = cut
    assert ours.hexdigest() == theirs.hexdigest() and ours.length == len(data)
    assert ours.digest() == ours.digest()  # (taking the digest leaves the state as it was)


@pytest.mark.parametrize("first", [0, 1, 55, 64, 100_001])
def test_a_state_taken_after_n_bytes_resumes_elsewhere(first):
    data = os.urandom(150_000)
    taken = Sha256(data[:first]).state()
    assert len(taken) == STATE_SIZE
    resumed = Sha256(b"other bytes, replaced by the state")
    resumed.restore(taken, first)
    resumed.update(data[first:])
    assert resumed.hexdigest() == hashlib.sha256(data).hexdigest()


def test_copy_is_a_hash_of_its_own():
    h = Sha256(b"abc")
    c = h.copy()
    c.update(b"def")
    assert h.hexdigest() == hashlib.sha256(b"abc").hexdigest()
    assert c.hexdigest() == hashlib.sha256(b"abcdef").hexdigest()


@pytest.mark.parametrize("length", [99, 101, 100 + (1 << 29), -1])
def test_a_state_said_to_follow_another_length_is_refused(length):
    state = Sha256(os.urandom(100)).state()
    with pytest.raises(StateError, match="not one after"):
        Sha256().restore(state, length)


def test_a_state_of_another_size_or_with_its_block_offset_out_of_range_is_refused():
    state = bytearray(Sha256(os.urandom(100)).state())
    with pytest.raises(StateError, match=f"is {STATE_SIZE} bytes"):
        Sha256().restore(bytes(state) + b"\0", 100)
    state[104:108] = (1000).to_bytes(4, "little")  # ``num``: OpenSSL would write past its block
    with pytest.raises(StateError, match="not one after 100 bytes"):
        Sha256().restore(bytes(state), 100)
