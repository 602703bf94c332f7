-- POSTGRES-ONLY
DROP INDEX idx_idem_keys_retain;
