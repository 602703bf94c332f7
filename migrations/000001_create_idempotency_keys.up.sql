-- POSTGRES-ONLY
-- idempotency_keys: one row per claimed (idem_key, scope_user_id, scope_endpoint).
-- Differences from ADR-0138, deliberate (see DESIGN.md "Storage"):
--   scope_user_id is TEXT NOT NULL DEFAULT '' ('' = no user scope) with no foreign key,
--   so unscoped keys conflict too and any user id type fits;
--   response_body_raw and response_headers hold non-JSON bodies and replayable headers;
--   attempt is the fencing token; locked_until is the owner's lease end;
--   seal_key_id is the key id a sealed response was sealed with (NULL: a plaintext response); a
--   sealed row keeps response_code, holds its envelope in response_body_raw and NULL in
--   response_body and response_headers (README, "Sealing stored responses");
--   owner_token is the claiming request's random token (NULL when the writer gave none), so a
--   request whose claim reply was lost recognises, or frees, its own in_flight row;
--   the primary key is (scope_user_id, id), not id alone: Citus distributes the table by
--   scope_user_id, and every unique constraint must then hold it (README, "Scale-out (Citus)");
--   idx_idem_keys_expires has no status predicate so cleanup also finds expired in-flight orphans.
-- Every time column is written from the database's now(), never an application clock.
CREATE TABLE idempotency_keys (
    id                 BIGSERIAL      NOT NULL,
    idem_key           TEXT           NOT NULL,
    scope_user_id      TEXT           NOT NULL DEFAULT '',
    scope_endpoint     TEXT           NOT NULL,
    request_hash       TEXT           NOT NULL,
    response_code      SMALLINT,
    response_body      JSONB,
    response_body_raw  BYTEA,
    response_headers   JSONB,
    seal_key_id        TEXT,
    status             TEXT           NOT NULL DEFAULT 'in_flight'
                                      CHECK (status IN ('in_flight','completed','failed')),
    attempt            INTEGER        NOT NULL DEFAULT 1,
    created_at         TIMESTAMPTZ    NOT NULL DEFAULT NOW(),
    locked_at          TIMESTAMPTZ    NOT NULL DEFAULT NOW(),
    locked_until       TIMESTAMPTZ    NOT NULL,
    expires_at         TIMESTAMPTZ    NOT NULL,
    owner_token        UUID,
    PRIMARY KEY (scope_user_id, id),
    CONSTRAINT uq_idem_key_user_endpoint
        UNIQUE (idem_key, scope_user_id, scope_endpoint)
);

-- This file runs before the table can be distributed, so its CREATE INDEX statements may share it
-- with the CREATE TABLE. Every later migration (up and down) holds one statement alone: on a
-- distributed table Citus refuses an ALTER TABLE or a CREATE INDEX that shares its file with other
-- statements (migrations_test.go checks it).
CREATE INDEX idx_idem_keys_expires
    ON idempotency_keys (expires_at);

CREATE INDEX idx_idem_keys_user
    ON idempotency_keys (scope_user_id)
    WHERE scope_user_id <> '';
