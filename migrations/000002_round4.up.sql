-- POSTGRES-ONLY
-- Round 4's schema (docs/sql.md). Later issues of the round add their columns to this statement; it is
-- frozen when the next release is tagged, as 000001 was. One statement alone, as Citus requires of
-- every migration after the first (migrations_test.go): a column more is one ADD COLUMN more here.
ALTER TABLE idempotency_keys
    -- [derive, #35] derive_key_id: the id of Config.DeriveKeys' key that was active when the row was
    -- claimed; every derived key of the row (package downstream) is computed under it, by the handler,
    -- any takeover and a reconcile, so a keyring rotation never changes the ids a retry sends
    -- downstream. NOT NULL DEFAULT '' ('' = no key: claimed without DeriveKeys, or before this
    -- migration): a constant default adds the column without rewriting the table, and the stores read
    -- it as a plain string, never NULL. The takeover keeps it (sets it only where it is '').
    ADD COLUMN derive_key_id TEXT NOT NULL DEFAULT ''
    -- [end derive]
;
