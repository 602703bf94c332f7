-- POSTGRES-ONLY
-- idempotency_keys: one row per claimed (idem_key, scope_user_id, scope_endpoint).
-- Differences from ADR-0138, deliberate (see DESIGN.md "Storage" and docs/storage.md, which gives
-- each choice below its measured cost):
--   scope_user_id is TEXT NOT NULL DEFAULT '' ('' = no user scope) with no foreign key,
--   so unscoped keys conflict too and any user id type fits;
--   the primary key is the natural key, uq_idem_key_user_endpoint (scope_user_id, idem_key,
--   scope_endpoint): the claim's conflict target and every fenced statement's lookup, with
--   scope_user_id first, as Citus needs (it distributes the table by scope_user_id, and every
--   unique constraint must hold it; README, "Scale-out (Citus)") and as erase and export by user
--   read it; no other unique index, and no index on scope_user_id alone (the key's prefix is one);
--   id is a row's identity for fences, the CLI and sealing (a key released and claimed again is a
--   new row with a new id), drawn from a sequence and not indexed;
--   request_hash is the SHA-256 as 32 bytes (the store sends and reads it as hex);
--   response_body (a JSON body) and response_body_raw (any other body) are BYTEA, stored and
--   replayed byte for byte; response_headers is the replayable headers' JSON as BYTEA;
--   attempt is the fencing token; locked_until is the owner's lease end;
--   seal_key_id is the key id a sealed response was sealed with (NULL: a plaintext response); a
--   sealed row keeps response_code, holds its envelope in response_body_raw and NULL in
--   response_body and response_headers (README, "Sealing stored responses");
--   owner_token is the claiming request's random token (NULL when the writer gave none), so a
--   request whose claim reply was lost recognises, or frees, its own in_flight row;
--   idx_idem_keys_expires has no status predicate so cleanup also finds expired in-flight orphans.
-- Every time column is written from the database's now(), never an application clock.
CREATE TABLE idempotency_keys (
    id                 BIGSERIAL      NOT NULL,
    idem_key           TEXT           NOT NULL,
    scope_user_id      TEXT           NOT NULL DEFAULT '',
    scope_endpoint     TEXT           NOT NULL,
    request_hash       BYTEA          NOT NULL,
    response_code      SMALLINT,
    response_body      BYTEA,
    response_body_raw  BYTEA,
    response_headers   BYTEA,
    seal_key_id        TEXT,
    status             TEXT           NOT NULL DEFAULT 'in_flight'
                                      CHECK (status IN ('in_flight','completed','failed')),
    attempt            INTEGER        NOT NULL DEFAULT 1,
    created_at         TIMESTAMPTZ    NOT NULL DEFAULT NOW(),
    locked_at          TIMESTAMPTZ    NOT NULL DEFAULT NOW(),
    locked_until       TIMESTAMPTZ    NOT NULL,
    expires_at         TIMESTAMPTZ    NOT NULL,
    owner_token        UUID,
    CONSTRAINT uq_idem_key_user_endpoint
        PRIMARY KEY (scope_user_id, idem_key, scope_endpoint)
);

-- This file runs before the table can be distributed, so its CREATE INDEX statements may share it
-- with the CREATE TABLE. Every later migration (up and down) holds one statement alone: on a
-- distributed table Citus refuses an ALTER TABLE or a CREATE INDEX that shares its file with other
-- statements (migrations_test.go checks it).
CREATE INDEX idx_idem_keys_expires
    ON idempotency_keys (expires_at);
