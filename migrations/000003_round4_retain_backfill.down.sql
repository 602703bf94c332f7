-- POSTGRES-ONLY
-- Nothing to undo: 000002's down drops the column. A statement golang-migrate can run.
SELECT 1;
