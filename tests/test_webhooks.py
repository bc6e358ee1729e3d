"""Standard Webhooks signing and verification: what a provider's callback must carry to be trusted."""

from __future__ import annotations

import base64
import time

import pytest

from vidjobs.common import signatures
from vidjobs.common.errors import ConfigError, WebhookRejected
from vidjobs.common.signatures import new_secret, sign, signed_headers, verify

BODY = b'{"type": "render.succeeded", "data": {"id": "rnd_1"}}'


@pytest.fixture
def secret() -> str:
    return new_secret()


def test_matches_the_reference_vector_of_the_specification():
    # The example published with the Standard Webhooks reference libraries.
    signature = sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330,
                     b'{"test": 2432232314}')
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_a_signed_delivery_verifies_and_yields_its_webhook_id(secret):
    headers = signed_headers(secret, BODY, msg_id="msg_abc")
    assert verify(secret, headers, BODY) == "msg_abc"


def test_header_names_are_case_insensitive(secret):
    headers = {k.title(): v for k, v in signed_headers(secret, BODY).items()}
    assert verify(secret, headers, BODY).startswith("msg_")


def test_a_tampered_body_is_rejected(secret):
    headers = signed_headers(secret, BODY)
    with pytest.raises(WebhookRejected, match="no v1 signature"):
        verify(secret, headers, BODY.replace(b"succeeded", b"failed"))


def test_another_secret_is_rejected(secret):
    headers = signed_headers(new_secret(), BODY)
    with pytest.raises(WebhookRejected, match="no v1 signature"):
        verify(secret, headers, BODY)


def test_a_changed_webhook_id_is_rejected(secret):
    # The id is signed: a replay cannot pose as a new message to slip past de-duplication.
    headers = {**signed_headers(secret, BODY, msg_id="msg_1"), "webhook-id": "msg_2"}
    with pytest.raises(WebhookRejected):
        verify(secret, headers, BODY)


@pytest.mark.parametrize("skew", [-301, 301, -3600, 3600])
def test_a_timestamp_outside_the_tolerance_is_rejected_both_ways(secret, skew):
    now = time.time()
    headers = signed_headers(secret, BODY, timestamp=int(now) + skew)
    with pytest.raises(WebhookRejected, match="tolerance"):
        verify(secret, headers, BODY, tolerance_s=300, now=now)


@pytest.mark.parametrize("skew", [-299, 0, 299])
def test_a_timestamp_inside_the_tolerance_is_accepted(secret, skew):
    now = time.time()
    headers = signed_headers(secret, BODY, timestamp=int(now) + skew)
    assert verify(secret, headers, BODY, tolerance_s=300, now=now)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_each_missing_header_is_rejected_by_name(secret, missing):
    headers = signed_headers(secret, BODY)
    del headers[missing]
    with pytest.raises(WebhookRejected, match=f"missing {missing}"):
        verify(secret, headers, BODY)


@pytest.mark.parametrize("stamp", ["soon", "1.5e9", "-5", ""])
def test_a_timestamp_that_is_not_unix_seconds_is_rejected(secret, stamp):
    headers = {**signed_headers(secret, BODY), "webhook-timestamp": stamp}
    with pytest.raises(WebhookRejected):
        verify(secret, headers, BODY)


def test_any_one_of_several_signatures_may_match(secret):
    # During key rotation a provider signs with the old and the new key; unknown schemes are skipped.
    headers = signed_headers(secret, BODY)
    stale = sign(new_secret(), headers["webhook-id"], int(headers["webhook-timestamp"]), BODY)
    headers["webhook-signature"] = f"v2,abc {stale} {headers['webhook-signature']}"
    assert verify(secret, headers, BODY) == headers["webhook-id"]


def test_a_signature_under_another_scheme_is_not_accepted(secret):
    headers = signed_headers(secret, BODY)
    headers["webhook-signature"] = headers["webhook-signature"].replace("v1,", "v1a,")
    with pytest.raises(WebhookRejected):
        verify(secret, headers, BODY)


def test_without_a_configured_secret_nothing_is_trusted():
    headers = signed_headers(new_secret(), BODY)
    with pytest.raises(WebhookRejected, match="no webhook secret"):
        verify("", headers, BODY)


def test_new_secrets_are_random_whsec_keys():
    first, second = new_secret(), new_secret()
    assert first != second and first.startswith("whsec_")
    assert len(base64.b64decode(first.removeprefix("whsec_"))) == 32
    assert signatures.decode_secret(first) == base64.b64decode(first.removeprefix("whsec_"))


@pytest.mark.parametrize("bad", ["whsec_not base64!", "whsec_"])
def test_a_malformed_secret_is_a_configuration_error(bad):
    with pytest.raises(ConfigError):
        signatures.decode_secret(bad)
