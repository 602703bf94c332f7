WITH bounds AS MATERIALIZED (
	SELECT set_config('idempotency.saved_lock_timeout', current_setting('lock_timeout'), true),
		set_config('lock_timeout', $8, true),
		set_config('statement_timeout', $9, true),
		set_config('idle_in_transaction_session_timeout', $9, true)
)
INSERT INTO idempotency_keys
	(idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	 created_at, locked_at, locked_until, expires_at, owner_token)
SELECT $1, $2, $3, $4, 'in_flight', 1,
	now(), now(), now() + $6::interval, now() + $5::interval, $7::uuid
FROM bounds
ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING
RETURNING id, request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers,
	created_at, locked_at, locked_until, expires_at,
	expires_at < now() AS expired, locked_until < now() AS lease_over,
	set_config('lock_timeout', current_setting('idempotency.saved_lock_timeout'), true) IS NOT NULL AS won
