-- rollout: expand: a nullable column the release before it neither writes nor reads (it reads breaker rows whole and ignores it).
-- A provider's circuit breaker also opens when the provider refuses our account (out of credit, our key
-- refused), not only when it is down: the row keeps the error code of the answer that last opened it, so the
-- jobs it holds back say which, and an operator sees it in `vidjobs breakers list`. Cleared when it closes.

-- submitter ------------------------------------------------------------------------------------------
ALTER TABLE provider_breakers ADD COLUMN cause text;
