"""The server secret that keys request fingerprints: HMAC-SHA-256, never stored in the ledger.

The ledger recognises a retry by a fingerprint of the request. An unsalted hash of the request
would let anyone with a copy of the ledger file confirm a guessed history or score vector
offline, so the ledger stores ``HMAC-SHA-256(key, SHA-256(kind ‖ canonical request bytes))``
instead: without the key a stored fingerprint says nothing about the request.

The key is 32 random bytes, kept as 64 hex digits (one line) in a file of mode 0600: by
default ``<ledger>.key`` next to the ledger, or ``serve --fingerprint-key FILE``. It is created
on first start, atomically (a complete file appears, or none), so several processes starting
at once all end up with the same key; with ``--workers N`` the parent creates it before forking.
A key file that others may read (any group/other permission bit) is refused, as ssh refuses a
private key. A ledger that stores requests is never paired with a new key silently: if its key
file is missing, the server refuses to start. Under a DIFFERENT key (a replaced key file), a
retry of a request stored under the previous key is refused as a conflict (ALREADY_EXISTS): it
is never answered with a fresh sample and never charged twice; budgets are unaffected.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

from recsvc.checks import MissingFileError, ParamError

KEY_BYTES = 32
_EXPECTED = f"a file of mode 0600 holding {2 * KEY_BYTES} hex digits (created by `recsvc serve` on first start)"


def default_path(ledger: str | os.PathLike[str]) -> Path:
    """``<ledger>.key``, next to the ledger."""
    p = Path(ledger)
    return p.with_name(p.name + ".key")


def keyed(key: bytes, digest: bytes) -> bytes:
    """The stored fingerprint of a request whose SHA-256 digest is ``digest``."""
    return hmac.digest(key, digest, "sha256")


def check(path: str | os.PathLike[str]) -> None:
    """Refuses, before anything is created, a key path that cannot hold or become a key."""
    p = Path(path)
    if p.exists() or p.is_symlink():
        load(p)
        return
    if not p.parent.is_dir():
        raise MissingFileError(
            "{fingerprint_key} directory {dir} does not exist; create it first (key file {path})",
            dir=str(p.parent),
            path=str(p),
        )
    if not os.access(p.parent, os.W_OK | os.X_OK):
        raise ParamError(
            "{fingerprint_key} {path} does not exist and its directory {dir} is not writable; expected " + _EXPECTED,
            path=str(p),
            dir=str(p.parent),
        )


def load(path: str | os.PathLike[str]) -> bytes:
    """The key in ``path``; a clear error for a missing, open-to-others or malformed file."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY)  # a symlink is followed (mounted secrets are links); its target is checked
    except FileNotFoundError:
        raise MissingFileError("{fingerprint_key} {path} does not exist; expected " + _EXPECTED, path=str(p)) from None
    except OSError as exc:  # unreadable, a dangling link, ...
        raise ParamError(
            "{fingerprint_key} {path} cannot be opened ({reason}); expected a regular file, " + _EXPECTED,
            path=str(p),
            reason=exc.strerror or str(exc),
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ParamError("{fingerprint_key} {path} is not a regular file; expected " + _EXPECTED, path=str(p))
        if st.st_mode & 0o077:
            raise ParamError(
                "{fingerprint_key} {path} has mode {mode}: others may read the key; "
                "expected mode 0600 (chmod 600 {path})",
                path=str(p),
                mode=oct(st.st_mode & 0o777),
            )
        raw = os.read(fd, 4 * KEY_BYTES + 2)
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise ParamError("{fingerprint_key} {path} is not a key; expected " + _EXPECTED, path=str(p))
    return key


def load_or_create(path: str | os.PathLike[str]) -> tuple[bytes, bool]:
    """(key, created): the key in ``path``, or a new one written there with mode 0600."""
    p = Path(path)
    if p.exists() or p.is_symlink():
        return load(p), False
    key = secrets.token_bytes(KEY_BYTES)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, (key.hex() + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, p)  # atomic, and fails if another process published its key first
    except FileExistsError:
        return load(p), False
    finally:
        tmp.unlink()
    dir_fd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the key must survive a crash as surely as the ledger rows keyed by it
    finally:
        os.close(dir_fd)
    return key, True
