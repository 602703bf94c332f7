-- MYSQL: round 4's schema (docs/sql.md). Later issues of the round add their columns to this file;
-- it is frozen when the next release is tagged, as 000001 was.
--
-- Bodies and headers become bytes, as on PostgreSQL: a JSON_VALID check refused responses the engine
-- records (JSON nested 32 levels deep on MariaDB, a lone surrogate escape such as "\ud800"), so the
-- handler's effect stood while its record failed and every retry was answered 409.
-- response_body_raw was LONGBLOB already and is restated so the three columns read alike. The data
-- keeps its bytes.
--
-- The checks go in two ways. MySQL 8.0 keeps a column's CHECK as a named table constraint
-- (idempotency_keys_chk_N) that MODIFY keeps: the first statement drops each CHECK of this table whose
-- clause calls JSON_VALID, by its name from information_schema.CHECK_CONSTRAINTS (MySQL 8.0.16 and
-- later, where CHECK exists), before the MODIFY. MariaDB's MODIFY drops the column's CHECK itself
-- (and MariaDB has no DROP CHECK), so there the statement built is a no-op, DO 0. Not run in CI,
-- which has MariaDB only. The status check stays on both.
SET @idempotency_round4 = COALESCE(IF(VERSION() LIKE '%MariaDB%', NULL, (
    SELECT CONCAT('ALTER TABLE idempotency_keys ',
                  GROUP_CONCAT('DROP CHECK `', REPLACE(tc.CONSTRAINT_NAME, '`', '``'), '`' SEPARATOR ', '))
    FROM information_schema.TABLE_CONSTRAINTS tc
    JOIN information_schema.CHECK_CONSTRAINTS cc
      ON cc.CONSTRAINT_SCHEMA = tc.CONSTRAINT_SCHEMA AND cc.CONSTRAINT_NAME = tc.CONSTRAINT_NAME
    WHERE tc.TABLE_SCHEMA = DATABASE() AND tc.TABLE_NAME = 'idempotency_keys'
      AND tc.CONSTRAINT_TYPE = 'CHECK' AND LOWER(cc.CHECK_CLAUSE) LIKE '%json_valid%')), 'DO 0');
PREPARE idempotency_round4 FROM @idempotency_round4;
EXECUTE idempotency_round4;
DEALLOCATE PREPARE idempotency_round4;
SET @idempotency_round4 = NULL;

ALTER TABLE idempotency_keys
    MODIFY response_body     LONGBLOB NULL,
    MODIFY response_body_raw LONGBLOB NULL,
    MODIFY response_headers  LONGBLOB NULL;

-- [derive, #35] derive_key_id: the id of Config.DeriveKeys' key that was active when the row was
-- claimed; every derived key of the row (package downstream) is computed under it, so a keyring
-- rotation never changes the ids a retry sends downstream. NOT NULL DEFAULT '' ('' = no key), read
-- as a plain string; ASCII and binary-compared, like seal_key_id. The takeover keeps it.
ALTER TABLE idempotency_keys
    ADD COLUMN derive_key_id VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '';
-- [end derive]
