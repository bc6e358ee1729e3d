"""The key ring that seals webhook signing secrets at rest (vidjobs.gateway.sealing): what one key seals
only it opens, and only for the row and column it was sealed for; a ring of several keys seals with the first
and opens with any; a missing or malformed VIDJOBS_SECRETS_KEY is refused with what to set; and `vidjobs up`
keeps the key it made in the data directory, readable by its owner only."""

from __future__ import annotations

import asyncio
import base64
import os
import stat
import sys

import pytest

from vidjobs.cli.supervisor import SERVICES, Supervisor
from vidjobs.cli.up import load_secrets
from vidjobs.common.errors import ConfigError
from vidjobs.gateway import sealing
from vidjobs.gateway.sealing import BadKeyring, Keyring, Tampered, UnknownKey

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_a_sealed_secret_opens_only_for_the_place_it_was_sealed_for():
    ring = Keyring.from_setting(sealing.new_key())
    sealed = ring.seal(SECRET, "webhook_endpoints.secret:whe_a")

    assert SECRET not in sealed and "whsec_" not in sealed
    assert ring.unseal(sealed, "webhook_endpoints.secret:whe_a") == SECRET
    assert ring.seal(SECRET, "webhook_endpoints.secret:whe_a") != sealed  # a fresh nonce every time
    for elsewhere in ("webhook_endpoints.secret:whe_b", "webhook_endpoints.previous_secret:whe_a",
                      "accounts.webhook_secret:whe_a"):
        with pytest.raises(Tampered):
            ring.unseal(sealed, elsewhere)
    key_id, _, body = sealed.partition(".")
    flipped = body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1]
    with pytest.raises(Tampered):
        ring.unseal(f"{key_id}.{flipped}", "webhook_endpoints.secret:whe_a")
    with pytest.raises(Tampered):
        ring.unseal("not sealed at all", "webhook_endpoints.secret:whe_a")


def test_a_ring_seals_with_its_first_key_and_opens_with_any():
    old, new = sealing.new_key(), sealing.new_key()
    sealed_old = Keyring.from_setting(old).seal(SECRET, "accounts.webhook_secret:acc_1")
    rotated = Keyring.from_setting(f"{new}, {old}")

    assert rotated.unseal(sealed_old, "accounts.webhook_secret:acc_1") == SECRET
    assert rotated.key_id_of(sealed_old) == Keyring.from_setting(old).primary_id != rotated.primary_id
    assert rotated.key_id_of(rotated.seal(SECRET, "accounts.webhook_secret:acc_1")) == rotated.primary_id
    assert rotated.ids == (rotated.primary_id, Keyring.from_setting(old).primary_id)
    with pytest.raises(UnknownKey, match=rotated.key_id_of(sealed_old)):
        Keyring.from_setting(new).unseal(sealed_old, "accounts.webhook_secret:acc_1")


@pytest.mark.parametrize("setting", ["", " ", "short", base64.urlsafe_b64encode(bytes(16)).decode(),
                                     f"{base64.urlsafe_b64encode(bytes(32)).decode()},", "!" * 43])
def test_a_missing_or_malformed_key_is_refused_saying_what_to_set(setting):
    with pytest.raises(BadKeyring) as refused:
        Keyring.from_setting(setting)

    assert isinstance(refused.value, ConfigError)
    assert "VIDJOBS_SECRETS_KEY" in str(refused.value) and "token_bytes(32)" in str(refused.value)


def test_a_key_is_taken_with_or_without_its_padding():
    key = sealing.new_key()
    assert Keyring.from_setting(key.rstrip("=")).primary_id == Keyring.from_setting(key).primary_id


def test_up_makes_a_key_once_and_keeps_it_for_its_owner_only(tmp_path):
    first = load_secrets(tmp_path)["secrets_key"]
    again = load_secrets(tmp_path)["secrets_key"]

    assert first == again
    assert Keyring.from_setting(first).primary_id
    assert stat.S_IMODE((tmp_path / "secrets.json").stat().st_mode) == 0o600


def test_of_the_processes_vidjobs_up_runs_only_the_gateway_is_given_the_key():
    supervisor = Supervisor({"VIDJOBS_SECRETS_KEY": sealing.new_key(), "VIDJOBS_HTTP_PORT": "8080"})

    given = {name: "VIDJOBS_SECRETS_KEY" in supervisor.env(name) for name in SERVICES}

    assert given == {name: name == "gateway" for name in SERVICES}
    assert all(supervisor.env(name)["VIDJOBS_HTTP_PORT"] == "8080" for name in SERVICES)


async def test_a_gateway_without_the_key_refuses_to_start_saying_what_to_set(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDJOBS_")} | {
        "VIDJOBS_DATA_DIR": str(tmp_path), "VIDJOBS_DATABASE_URL": "postgresql://127.0.0.1:9/none",
        "VIDJOBS_NATS_URL": "nats://127.0.0.1:9", "VIDJOBS_LOG_FORMAT": "text"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "vidjobs.gateway", env=env,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 30)  # before it reaches for the database
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    assert proc.returncode == 2, err
    assert b"VIDJOBS_SECRETS_KEY" in err and b"token_bytes(32)" in err, err
