WITH ins AS (
	INSERT INTO idempotency_keys
		(idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
		 created_at, locked_at, locked_until, expires_at, owner_token)
	VALUES ($1, $2, $3, $4, 'in_flight', 1,
		now(), now(), now() + $6::interval, now() + $5::interval, $7::uuid)
	ON CONFLICT (idem_key, scope_user_id, scope_endpoint) DO NOTHING
	RETURNING id, request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers,
	created_at, locked_at, locked_until, expires_at,
	expires_at < now() AS expired, locked_until < now() AS lease_over
)
SELECT *, true AS won FROM ins
UNION ALL
SELECT id, request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers,
	created_at, locked_at, locked_until, expires_at,
	expires_at < now() AS expired, locked_until < now() AS lease_over,
	(status = 'in_flight' AND locked_until >= now() AND owner_token = $7::uuid) IS TRUE AS won
FROM idempotency_keys
WHERE idem_key = $1 AND scope_user_id = $2 AND scope_endpoint = $3
	AND NOT EXISTS (SELECT 1 FROM ins)
