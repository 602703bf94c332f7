-- MYSQL: back to 000001's columns: JSON bodies and headers as utf8mb4 text under a JSON_VALID check.
-- It fails, and changes nothing, while a row holds what those columns refuse (JSON deeper than the
-- server's JSON_VALID takes, a lone surrogate escape, bytes that are not UTF-8 under a strict
-- sql_mode): delete those keys, or let them expire and run cleanup, first.
ALTER TABLE idempotency_keys
    MODIFY response_body    LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL CHECK (response_body IS NULL OR JSON_VALID(response_body)),
    MODIFY response_headers LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL CHECK (response_headers IS NULL OR JSON_VALID(response_headers))
