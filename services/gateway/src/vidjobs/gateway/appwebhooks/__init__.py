"""Webhooks to accounts' apps: the endpoints an account registers (endpoints.py), a job's own `webhook_url`,
the secrets that sign what is sent, shown once and stored sealed (secrets.py; resealing.py keeps them sealed
under the gateway's current key), the request-forgery guard every URL passes (urls.py), delivering what
happened to an account's jobs (deliveries.py, signed with Standard Webhooks, claimed by replicas in shares
by claims.py), and what was delivered to each endpoint, sent again by hand (history.py)."""
