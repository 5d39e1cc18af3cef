"""Files that hold secrets (token files, private keys, sealing keys): readable and writable by
their owner alone, as ssh's keys, for a secret anyone on the host can read is no secret. One
reader for all of them; its ValueError names the file and what is wrong (the daemon exits 2)."""

from __future__ import annotations

import os


def owner_only(path: str, what: str) -> os.stat_result:
    """The file's stat, unless others than its owner may read or write it."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    mode = st.st_mode & 0o777
    if mode & 0o077:
        raise ValueError(f"{path}: mode {mode:04o} lets others than its owner read or write it; {what} must be "
                         f"secret: chmod 600 {path}")
    return st


def read_secret(path: str, what: str) -> str:
    owner_only(path, what)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None


def tokens_in(path: str) -> set[str]:
    """The tokens of a token file, one a line."""
    tokens = {line.strip() for line in read_secret(path, "tokens").splitlines() if line.strip()}
    if not tokens:
        raise ValueError(f"{path}: no token in the file")
    return tokens
