-- POSTGRES-ONLY
-- Round 4's schema (DESIGN-settled-r4 item 31). Every later migration holds one statement alone, as
-- Citus requires of a statement changing a distributed table (migrations_test.go): this file is
-- round 4's ALTER TABLE; 000003 to 000005 are the statements that cannot share it (a backfill and two
-- indexes). Later issues of the round add their columns to this statement, each in a block of its own.

-- BEGIN retain_until (issue #36, tombstones; settled item 20).
-- retain_until is when cleanup may delete the row: expires_at, or under RouteConfig.ExpiredRefuse
-- expires_at + Grace, the row being a tombstone in between (refused 422 idempotency_key_expired, its
-- response purged). The claim and the takeover write it. The default, -infinity, is what a row written
-- by a binary older than round 4 gets (settled item 10: such a binary keeps working): every statement
-- reads retain_until together with expires_at, so -infinity means "no tombstone, deleted at expiry".
-- A constant default adds the column without rewriting the table; 000003 backfills the existing rows.
-- END retain_until.
ALTER TABLE idempotency_keys
    ADD COLUMN retain_until TIMESTAMPTZ NOT NULL DEFAULT '-infinity';
