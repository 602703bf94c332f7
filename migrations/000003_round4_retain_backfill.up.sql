-- POSTGRES-ONLY
-- Issue #36 (settled item 20): the rows written before 000002 are retained until their expiry, as
-- before (no tombstones among them), so cleanup finds them through idx_idem_keys_retain (000004)
-- in expiry order. One UPDATE of the whole table: run it where a full-table write is acceptable.
UPDATE idempotency_keys SET retain_until = expires_at WHERE retain_until = '-infinity';
