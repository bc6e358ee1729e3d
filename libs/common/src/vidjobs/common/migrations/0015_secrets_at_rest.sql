-- rollout: expand: the first half of a split (sealed secrets beside the plaintext ones); the release before it reads an
-- emptied secret as unusable and leaves that delivery to a new gateway.
-- Webhook signing secrets are kept sealed (AES-GCM under VIDJOBS_SECRETS_KEY, which only the gateway holds:
-- services/gateway/sealing.py), and can be rotated: until `previous_..._expires_at`, deliveries are signed
-- with the secret a rotation replaced as well as the new one, so a receiver can switch without losing any.
--
-- Expand now, contract a release later. This migration adds the sealed columns and lets the plaintext ones
-- empty. The gateway, at start and every few minutes after (services/gateway/appwebhooks/resealing.py),
-- seals whatever plaintext is left and empties it. Emptied means '' rather than NULL, on purpose: a gateway
-- of the previous release still running during the rollout reads '' as a malformed secret and leaves the
-- delivery for a new gateway to send, where NULL would read as "no secret" and disable the endpoint. The
-- next release drops `webhook_endpoints.secret` and `accounts.webhook_secret`, refusing to while any still
-- holds a secret.

-- gateway --------------------------------------------------------------------------------------------
ALTER TABLE webhook_endpoints
    ALTER COLUMN secret DROP NOT NULL,
    ALTER COLUMN secret SET DEFAULT '',
    ADD COLUMN secret_sealed text,                       -- the current secret, sealed
    ADD COLUMN secret_created_at timestamptz,            -- when it was made (registered or rotated)
    ADD COLUMN previous_secret_sealed text,              -- the secret the last rotation replaced, sealed
    ADD COLUMN previous_secret_expires_at timestamptz;   -- until then it signs too
UPDATE webhook_endpoints SET secret_created_at = created_at;
ALTER TABLE webhook_endpoints
    ALTER COLUMN secret_created_at SET DEFAULT now(),
    ALTER COLUMN secret_created_at SET NOT NULL;

-- The account's secret, which signs deliveries to the webhook_url a job names; NULL until the account makes
-- one (POST /v1/account/webhook-secret).
ALTER TABLE accounts
    ADD COLUMN webhook_secret_sealed text,
    ADD COLUMN webhook_secret_created_at timestamptz,
    ADD COLUMN webhook_previous_secret_sealed text,
    ADD COLUMN webhook_previous_secret_expires_at timestamptz;
UPDATE accounts SET webhook_secret_created_at = now() WHERE webhook_secret IS NOT NULL;
