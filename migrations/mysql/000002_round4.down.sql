-- MYSQL: back to 000001's column types: JSON bodies and headers as utf8mb4 text. Not its JSON_VALID
-- checks: they were the defect 000002 fixes (they refused JSON 32 levels deep and lone surrogate
-- escapes), a binary of v0.1.0 works without them, and with them this step would fail on the very
-- rows it has to keep, and leave `migrate down` (which drops the table) stuck at a dirty version.
-- Every body and header the library records in these columns is UTF-8, so the conversion keeps them.
ALTER TABLE idempotency_keys
    MODIFY response_body    LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    MODIFY response_headers LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
;

-- [derive, #35]
ALTER TABLE idempotency_keys DROP COLUMN derive_key_id;
-- [end derive]
