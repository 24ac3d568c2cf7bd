"""Credentials at rest: AES-GCM with the row's identity as associated data (SPEC §5).

A ciphertext is bound to (table, org, row, key version): copied to another row or tenant it does
not decrypt. Keys come from the environment as `VERSION:BASE64KEY` pairs, newest first; the
newest encrypts, any listed one decrypts, so keys rotate by adding one and re-encrypting.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE_BYTES = 12


class CryptoError(Exception):
    """Keys are missing or malformed, or a ciphertext does not decrypt here."""


@dataclass(frozen=True)
class Sealed:
    """A ciphertext and the key version that made it."""

    ciphertext: bytes
    key_version: int


class Keyring:
    """The process's credential keys. Never logged, never rendered."""

    def __init__(self, keys: Mapping[int, bytes]) -> None:
        if not keys:
            raise CryptoError("no credential keys configured (LEMBRA_SECRET_KEYS)")
        for version, key in keys.items():
            if len(key) != 32:
                raise CryptoError(f"key version {version} is not 32 bytes")
        self._keys = dict(keys)
        self.current_version = max(self._keys)

    def __repr__(self) -> str:
        return f"<Keyring versions={sorted(self._keys)}>"

    @classmethod
    def parse(cls, spec: str) -> "Keyring":
        """Parse 'VERSION:BASE64KEY,VERSION:BASE64KEY'."""
        keys: dict[int, bytes] = {}
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            version_text, sep, encoded = part.partition(":")
            try:
                if not sep:
                    raise ValueError
                version = int(version_text)
                key = base64.b64decode(encoded, validate=True)
            except (ValueError, base64.binascii.Error):
                raise CryptoError("LEMBRA_SECRET_KEYS must look like '1:BASE64KEY,2:BASE64KEY'") from None
            if version in keys:
                raise CryptoError(f"key version {version} listed twice")
            keys[version] = key
        return cls(keys)

    @staticmethod
    def generate_spec(version: int = 1) -> str:
        """A fresh 'VERSION:BASE64KEY' entry."""
        return f"{version}:{base64.b64encode(os.urandom(32)).decode()}"

    def versions(self) -> list[int]:
        return sorted(self._keys)

    def derive(self, purpose: str, version: int | None = None) -> bytes:
        """A 32-byte key for another purpose (session signing, opt-out links), derived with
        HKDF from the current key (or from key `version`, which must be configured) so that
        there is one secret to keep."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        key = self._keys.get(self.current_version if version is None else version)
        if key is None:
            raise CryptoError(f"key version {version} is not configured")
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=f"lembra|{purpose}".encode())
        return hkdf.derive(key)

    def seal(self, data: Mapping[str, Any], *, table: str, org_id: int, row_id: int) -> Sealed:
        """Encrypt a credentials mapping for one row."""
        version = self.current_version
        nonce = os.urandom(NONCE_BYTES)
        plaintext = json.dumps(dict(data), sort_keys=True).encode()
        aad = _aad(table, org_id, row_id, version)
        return Sealed(nonce + AESGCM(self._keys[version]).encrypt(nonce, plaintext, aad), version)

    def open(self, sealed: bytes, *, key_version: int, table: str, org_id: int, row_id: int) -> dict[str, Any]:
        """Decrypt a row's credentials; CryptoError if the key is gone or the row is not this one."""
        key = self._keys.get(key_version)
        if key is None:
            raise CryptoError(f"key version {key_version} is not configured")
        nonce, body = bytes(sealed[:NONCE_BYTES]), bytes(sealed[NONCE_BYTES:])
        try:
            plaintext = AESGCM(key).decrypt(nonce, body, _aad(table, org_id, row_id, key_version))
        except InvalidTag:
            raise CryptoError("credentials do not decrypt for this row") from None
        return json.loads(plaintext)


def _aad(table: str, org_id: int, row_id: int, version: int) -> bytes:
    return f"lembra|{table}|org={org_id}|row={row_id}|v={version}".encode()
