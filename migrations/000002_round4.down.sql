-- POSTGRES-ONLY
-- Back to version 1: round 4's columns go (BEGIN retain_until ... END retain_until: issue #36).
ALTER TABLE idempotency_keys
    DROP COLUMN retain_until;
