-- POSTGRES-ONLY
-- Round 4's schema (docs/sql.md; DESIGN-settled-r4 item 31). Every migration after the first holds
-- one statement alone, as Citus requires of a statement changing a distributed table
-- (migrations_test.go): this file is round 4's ALTER TABLE, and 000003 to 000005 are the statements
-- that cannot share it (a backfill and two indexes). Later issues of the round add their columns to
-- this statement, each in a block of its own; it is frozen when the next release is tagged.
ALTER TABLE idempotency_keys
    -- [derive, #35] derive_key_id: the id of Config.DeriveKeys' key that was active when the row was
    -- claimed; every derived key of the row (package downstream) is computed under it, by the handler,
    -- any takeover and a reconcile, so a keyring rotation never changes the ids a retry sends
    -- downstream. NOT NULL DEFAULT '' ('' = no key: claimed without DeriveKeys, or before this
    -- migration): a constant default adds the column without rewriting the table, and the stores read
    -- it as a plain string, never NULL. The takeover keeps it (sets it only where it is '').
    ADD COLUMN derive_key_id TEXT NOT NULL DEFAULT '',
    -- [end derive]
    -- [retain_until, #36; settled item 20] retain_until is when cleanup may delete the row:
    -- expires_at, or under RouteConfig.ExpiredRefuse expires_at + Grace, the row being a tombstone in
    -- between (refused 422 idempotency_key_expired, its response purged). The claim and the takeover
    -- write it. The default, -infinity, is what a row written by a binary older than round 4 gets
    -- (settled item 10: such a binary keeps working): every statement reads retain_until together with
    -- expires_at, so -infinity means "no tombstone, deleted at expiry". A constant default adds the
    -- column without rewriting the table; 000003 backfills the existing rows.
    ADD COLUMN retain_until TIMESTAMPTZ NOT NULL DEFAULT '-infinity',
    -- [end retain_until]
    -- [purged, #36/#37] purged: cleanup has purged this tombstone (its response is gone, or it never
    -- had one). idx_idem_keys_purge (000005) holds the tombstones not yet purged by this flag, not by
    -- their response columns: an index whose key or predicate names a column the record writes makes
    -- every record a non-HOT update (a new tuple, an entry in every index). Only cleanup sets it; a
    -- takeover clears it. A constant default adds the column without rewriting the table.
    ADD COLUMN purged BOOLEAN NOT NULL DEFAULT false
    -- [end purged]
;
