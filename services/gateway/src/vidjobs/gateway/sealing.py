"""Sealing the secrets the gateway keeps in the database (webhook signing secrets), with a key only the gateway
holds: `VIDJOBS_SECRETS_KEY`, 32 random bytes in base64url. A copy of the database, a backup or a worker's
view of it then holds nothing that signs a delivery.

A sealed value is `<key id>.<base64url of nonce + AES-GCM ciphertext>`. The key id (a short hash of the key)
says which key sealed it, so the setting may list several keys, comma-separated: the first seals, any opens.
That is how the key itself is replaced: list the new key first and the old one after it; the gateway reseals
under the first (appwebhooks/resealing.py), and once it has, the old key can be dropped from the list.

Each value is sealed for one place, a row's id and column (the associated data), so a sealed value copied to
another row or column does not open.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from vidjobs.common.errors import ConfigError
from vidjobs.common.settings import Settings

SETTING = "VIDJOBS_SECRETS_KEY"
KEY_BYTES = 32
NONCE_BYTES = 12
KEY_ID_CHARS = 8
MAKE_ONE = 'python3 -c "import secrets,base64;print(base64.urlsafe_b64encode(secrets.token_bytes(32)).decode())"'


class BadKeyring(ConfigError):
    """VIDJOBS_SECRETS_KEY is unset or is not a list of base64url 32-byte keys; the message says how to make one."""


class CannotUnseal(Exception):
    """A sealed value that does not open."""


class UnknownKey(CannotUnseal):
    """Sealed under a key the ring does not hold: VIDJOBS_SECRETS_KEY lost a key still in use."""


class Tampered(CannotUnseal):
    """Not a value its key sealed for this place: altered, or copied from another row or column."""


def new_key() -> str:
    """A fresh key, as VIDJOBS_SECRETS_KEY takes it."""
    return base64.urlsafe_b64encode(secrets.token_bytes(KEY_BYTES)).decode()


def _b64decode(text: str) -> bytes:
    """Strict base64url, its padding optional: a stray character is an error, never silently dropped."""
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def key_id(key: bytes) -> str:
    """A short, stable name for a key that tells nothing of it: the start of a hash of it."""
    return _b64encode(hashlib.sha256(b"vidjobs secrets key id\x00" + key).digest())[:KEY_ID_CHARS]


def _refused(why: str) -> BadKeyring:
    return BadKeyring(f"{SETTING} {why}: set it to 32 random bytes in base64url (the gateway alone needs it; "
                      f"several, comma-separated, while replacing one: the first seals). Make one with: {MAKE_ONE}")


def _parse_key(text: str, position: int) -> bytes:
    try:
        key = _b64decode(text)
    except (binascii.Error, ValueError):
        raise _refused(f"key {position} is not base64url") from None
    if len(key) != KEY_BYTES:
        raise _refused(f"key {position} is {len(key)} bytes, not {KEY_BYTES}")
    return key


@dataclass(frozen=True)
class Keyring:
    """The keys that seal and open secrets at rest: the first seals, any opens (by the id a value names)."""

    keys: tuple[tuple[str, AESGCM], ...]  # (key id, cipher), the sealing key first

    @classmethod
    def from_setting(cls, setting: str) -> Keyring:
        parts = [part.strip() for part in setting.split(",")]
        if not any(parts):
            raise _refused("is not set")
        if not all(parts):
            raise _refused("has an empty entry")
        keys = [_parse_key(part, n) for n, part in enumerate(parts, 1)]
        return cls(tuple((key_id(key), AESGCM(key)) for key in keys))

    @property
    def primary_id(self) -> str:
        return self.keys[0][0]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(kid for kid, _ in self.keys)

    def seal(self, plaintext: str, place: str) -> str:
        """`plaintext` sealed under the first key for `place` (e.g. `webhook_endpoints.secret:whe_...`)."""
        kid, cipher = self.keys[0]
        nonce = secrets.token_bytes(NONCE_BYTES)
        return f"{kid}.{_b64encode(nonce + cipher.encrypt(nonce, plaintext.encode(), place.encode()))}"

    def unseal(self, sealed: str, place: str) -> str:
        """What `seal(..., place)` sealed. Raises UnknownKey or Tampered."""
        kid, dot, body = sealed.partition(".")
        if not dot:
            raise Tampered(f"not a sealed value (for {place})")
        cipher = dict(self.keys).get(kid)
        if cipher is None:
            raise UnknownKey(f"sealed under key {kid}, which {SETTING} does not hold (it holds {', '.join(self.ids)})")
        try:
            raw = _b64decode(body)
            return cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], place.encode()).decode()
        except (binascii.Error, ValueError, InvalidTag):
            raise Tampered(f"the value sealed under key {kid} does not open for {place}") from None

    def key_id_of(self, sealed: str) -> str:
        return sealed.partition(".")[0]


@functools.lru_cache(maxsize=4)
def _ring(setting: str) -> Keyring:
    return Keyring.from_setting(setting)


def keyring(settings: Settings) -> Keyring:
    """The ring of these settings, made once per process (every delivery signs with what it opens)."""
    return _ring(settings.secrets_key)


@functools.lru_cache(maxsize=8)
def _subkeys(setting: str, purpose: bytes) -> tuple[tuple[str, bytes], ...]:
    keys = [_parse_key(part.strip(), n) for n, part in enumerate(setting.split(","), 1)]
    return tuple((key_id(key), hmac.new(key, b"vidjobs subkey\x00" + purpose, hashlib.sha256).digest())
                 for key in keys)


def subkeys(settings: Settings, purpose: bytes) -> tuple[tuple[str, bytes], ...]:
    """Keys for another use than sealing (signing browser tokens), each derived from one key of the ring and
    named by that key's id, the first for signing: replacing VIDJOBS_SECRETS_KEY replaces them too."""
    keyring(settings)  # refuses a bad setting with the message that says how to make one
    return _subkeys(settings.secrets_key, purpose)
