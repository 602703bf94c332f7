-- MYSQL: MySQL 8.0 and MariaDB 10.11 (docs/sql.md says why each column is as it is).
-- The key, scope and endpoint are binary strings, compared byte for byte as on PostgreSQL: never a
-- _ci collation (AbC = abc, Alice = alice) nor utf8mb4_bin (trailing spaces ignored on MariaDB).
-- uq_idem_key_user_endpoint then takes 2,309 bytes, under InnoDB's 3,072, and is a B-tree: MariaDB
-- turns an over-long unique key into USING HASH without a word, and such keys accepted duplicates at
-- READ COMMITTED until MDEV-37199. Times are DATETIME(6) in UTC, written from UTC_TIMESTAMP(6): never
-- NOW() (whole seconds, the session's time_zone) or TIMESTAMP (ends in 2038).
CREATE TABLE idempotency_keys (
    id                 BIGINT          NOT NULL AUTO_INCREMENT,
    idem_key           VARBINARY(255)  NOT NULL,
    scope_user_id      VARBINARY(1024) NOT NULL DEFAULT '',
    scope_endpoint     VARBINARY(1024) NOT NULL,
    request_hash       CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    response_code      SMALLINT        NULL,
    response_body      LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL CHECK (response_body IS NULL OR JSON_VALID(response_body)),
    response_body_raw  LONGBLOB        NULL,
    response_headers   LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL CHECK (response_headers IS NULL OR JSON_VALID(response_headers)),
    seal_key_id        VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NULL,
    status             VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'in_flight'
                       CHECK (status IN ('in_flight', 'completed', 'failed')),
    attempt            INT             NOT NULL DEFAULT 1,
    created_at         DATETIME(6)     NOT NULL,
    locked_at          DATETIME(6)     NOT NULL,
    locked_until       DATETIME(6)     NOT NULL,
    expires_at         DATETIME(6)     NOT NULL,
    owner_token        BINARY(16)      NULL,
    PRIMARY KEY (id),
    CONSTRAINT uq_idem_key_user_endpoint UNIQUE KEY (idem_key, scope_user_id, scope_endpoint) USING BTREE,
    KEY idx_idem_keys_expires (expires_at),
    KEY idx_idem_keys_user (scope_user_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
