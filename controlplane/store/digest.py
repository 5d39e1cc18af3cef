"""A SHA-256 digest held as its bytes and written as its hex (a machine's credential in its
record, store/records.py), and msgspec's hooks that read and write it so."""

from __future__ import annotations

import hashlib
from typing import Any


class Digest(bytes):
    """A SHA-256 digest as its 32 bytes, written as its hex as before (a machine's credential):
    81 bytes in memory where the hex string held 113, in every process, for every machine (issue
    #38). Text that is not hex (a record no version of ours wrote) is kept as its own bytes: like
    its text before, it matches no credential."""

    __slots__ = ()

    @classmethod
    def of(cls, text: str) -> Digest:
        # surrogateescape: a header's bytes that are not UTF-8 hash as they came
        return cls(hashlib.sha256(text.encode(errors="surrogateescape")).digest())

    @classmethod
    def parse(cls, value: Any) -> Digest:
        if isinstance(value, cls):
            return value
        if isinstance(value, (bytes, bytearray)):
            return cls(value)
        if not isinstance(value, str):
            raise ValueError(f"a digest is written as hex text, not {type(value).__name__}")
        try:
            return cls(bytes.fromhex(value))
        except ValueError:
            return cls(value.encode(errors="surrogateescape"))


NO_DIGEST = Digest()


def enc_hook(value: Any) -> Any:
    """msgspec's hook for what it does not know: a Digest as its hex."""
    if isinstance(value, Digest):
        return value.hex()
    raise NotImplementedError(f"{type(value).__name__} is not a record's value")


def dec_hook(kind: type, value: Any) -> Any:
    """msgspec's hook for what it does not know: a Digest from its hex."""
    if kind is Digest:
        return Digest.parse(value)
    raise NotImplementedError(f"{kind} is not a record's type")
