-- POSTGRES-ONLY
-- Issue #36: cleanup purges the responses of tombstones past expires_at through this index
-- (pgsql.PurgeBatchSQL, whose predicate it repeats, pgsql.Purgeable). It is partial: a purged
-- tombstone leaves it (cleanup sets purged), so a batch never walks the tombstones purged before (up
-- to 30 days of them), and a row of an ExpiredRunAgain route never enters it. Its predicate names no
-- column the record writes, so the record stays a HOT update (000002's purged).
CREATE INDEX idx_idem_keys_purge
    ON idempotency_keys (expires_at)
    WHERE retain_until > expires_at AND NOT purged;
