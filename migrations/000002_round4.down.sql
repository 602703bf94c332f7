-- POSTGRES-ONLY
-- Back to 000001's table: round 4's columns go (one statement, as Citus requires).
ALTER TABLE idempotency_keys
    DROP COLUMN IF EXISTS derive_key_id,
    DROP COLUMN IF EXISTS retain_until,
    DROP COLUMN IF EXISTS purged
;
