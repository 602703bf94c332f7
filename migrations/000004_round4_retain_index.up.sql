-- POSTGRES-ONLY
-- Issue #36 (settled item 20): cleanup deletes the rows past retain_until, earliest first, through
-- this index (pgsql.ExpiredBatchSQL).
CREATE INDEX idx_idem_keys_retain
    ON idempotency_keys (retain_until);
