"""Webhook signing secrets against the reference library (standardwebhooks, pinned in the test group): every
form of a secret it takes (with or without `whsec_`, padded, unpadded or over-padded, with whitespace) is one
ours takes as the same key, so a delivery either signs verifies with the other; what it refuses, ours refuses
at start, saying why. Where it takes text that is not base64 by dropping the characters it cannot read (a
URL-safe secret, a mistyped prefix) or ignoring what follows its padding, ours refuses it: standardwebhooks
would sign with some other key than the one meant, or hide a mangled secret, and deliveries would fail to
verify without a word why."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import EmptyWebhookSecretError

from vidjobs.common import signatures
from vidjobs.common.errors import ConfigError
from vidjobs.providers.replicate import ReplicateAdapter

BODY = b'{"id": "x18c1re8mxrma0crb3x8wbwqmg", "status": "succeeded"}'
# Keys whose base64 ends in no padding, `=` and `==`: each form below is made of all three.
KEYS = [bytes(range(1, 31)), bytes(range(1, 32)), bytes(range(1, 33))]


def forms(key: bytes) -> dict[str, str]:
    text = base64.b64encode(key).decode()
    return {
        "whsec_, padded": f"whsec_{text}",
        "whsec_, unpadded": "whsec_" + text.rstrip("="),
        "whsec_, over-padded": f"whsec_{text}==",
        "bare, padded": text,
        "bare, unpadded": text.rstrip("="),
        "a file's trailing newline": f"whsec_{text}\n",
        "wrapped over lines": f"whsec_{text[:20]}\n{text[20:]}",
    }


FORMS = [(f"{len(key)} bytes, {name}", key, secret) for key in KEYS for name, secret in forms(key).items()]


def theirs_headers(secret: str, body: bytes, msg_id: str = "msg_1") -> dict[str, str]:
    now = int(time.time())
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(now, tz=UTC), body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(now), "webhook-signature": signature}


@pytest.mark.parametrize(("form", "key", "secret"), FORMS, ids=[f for f, _, _ in FORMS])
def test_every_form_standardwebhooks_takes_is_the_same_key_to_us(form, key, secret):
    canonical = "whsec_" + base64.b64encode(key).decode()

    assert signatures.decode_secret(secret) == key
    # Signed by the reference library under this form, verified by us; signed by us, verified by it.
    assert signatures.verify(secret, theirs_headers(secret, BODY), BODY) == "msg_1"
    assert signatures.verify(canonical, theirs_headers(secret, BODY), BODY) == "msg_1"
    Webhook(secret).verify(BODY, signatures.signed_headers(secret, BODY))
    Webhook(canonical).verify(BODY, signatures.signed_headers(secret, BODY))


@pytest.mark.parametrize(("form", "key", "secret"), FORMS, ids=[f for f, _, _ in FORMS])
async def test_an_adapter_starts_with_every_such_form_and_verifies_what_standardwebhooks_signs(http, form, key,
                                                                                               secret):
    adapter = ReplicateAdapter(http, "http://127.0.0.1:9", "r8_test", secret)

    assert adapter.verify_callback(theirs_headers(secret, BODY, "msg_2"), BODY) == "msg_2"


# What standardwebhooks refuses: nothing to decode, or a length base64 cannot have.
REFUSED_BY_BOTH = {
    "nothing after whsec_": "whsec_",
    "padding only": "whsec_==",
    "whitespace only": " \n",
    "one base64 character": "whsec_A",
    "a length one over whole bytes": "whsec_" + base64.b64encode(bytes(range(32))).decode().rstrip("=") + "AA",
}


@pytest.mark.parametrize("secret", REFUSED_BY_BOTH.values(), ids=REFUSED_BY_BOTH.keys())
def test_what_standardwebhooks_refuses_we_refuse_at_start_saying_why(http, secret):
    with pytest.raises((EmptyWebhookSecretError, ValueError)):
        Webhook(secret)
    with pytest.raises(ConfigError) as refused:
        signatures.decode_secret(secret)
    with pytest.raises(ConfigError):
        ReplicateAdapter(http, "http://127.0.0.1:9", "r8_test", secret)

    assert "webhook secret is" in str(refused.value)
    assert any(why in str(refused.value) for why in ("empty", "cannot be whole bytes"))


# Text standardwebhooks reads only by dropping the characters that are not base64: the key it signs with is then
# not the one the text meant.
URL_SAFE_KEY = bytes([251, 255, 191] * 11)  # its base64 is all `+` and `/`: URL-safe, all `-` and `_`
NOT_BASE64 = {
    "URL-safe base64": ("whsec_" + base64.urlsafe_b64encode(URL_SAFE_KEY).decode(), URL_SAFE_KEY),
    "an upper-case prefix": ("WHSEC_" + base64.b64encode(KEYS[2]).decode(), KEYS[2]),
    "the prefix twice": ("whsec_whsec_" + base64.b64encode(KEYS[2]).decode(), KEYS[2]),
}


@pytest.mark.parametrize(("secret", "meant"), NOT_BASE64.values(), ids=NOT_BASE64.keys())
def test_text_that_is_not_base64_is_refused_where_standardwebhooks_would_sign_with_another_key(secret, meant):
    canonical = "whsec_" + base64.b64encode(meant).decode()
    with pytest.raises(Exception):  # noqa: B017 - whichever it raises: the key meant does not verify
        Webhook(secret).verify(BODY, theirs_headers(canonical, BODY))

    with pytest.raises(ConfigError) as refused:
        signatures.decode_secret(secret)

    message = str(refused.value)
    assert "base64's alphabet" in message and "URL-safe" in message
    assert secret.removeprefix("whsec_")[:12] not in message  # the secret itself stays out of logs


def test_text_after_the_padding_is_refused_where_standardwebhooks_ignores_it():
    """standardwebhooks stops reading at padding that ends the key and ignores whatever follows: two secrets
    pasted together, or a truncated copy, would pass unnoticed. Ours refuses it."""
    meant = "whsec_" + base64.b64encode(KEYS[1]).decode()
    secret = meant + "AAAA"
    Webhook(secret).verify(BODY, theirs_headers(meant, BODY))  # the trailing text changed nothing for it

    with pytest.raises(ConfigError) as refused:
        signatures.decode_secret(secret)

    assert "= padding at the end only" in str(refused.value)


def test_a_new_secret_is_in_the_canonical_form_both_read():
    secret = signatures.new_secret()

    assert secret.startswith("whsec_") and len(signatures.decode_secret(secret)) == 32
    Webhook(secret).verify(BODY, signatures.signed_headers(secret, BODY))
