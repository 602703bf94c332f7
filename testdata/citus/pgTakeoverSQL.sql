UPDATE idempotency_keys SET
	attempt = attempt + 1,
	request_hash = $4,
	status = 'in_flight',
	response_code = NULL,
	response_body = NULL,
	response_body_raw = NULL,
	response_headers = NULL,
	created_at = now(),
	locked_at = now(),
	locked_until = now() + $6::interval,
	expires_at = now() + $5::interval,
	owner_token = $7::uuid
WHERE scope_user_id = $3 AND id = $1 AND attempt = $2 AND expires_at < now()
	AND NOT (status = 'in_flight' AND locked_until >= now())
RETURNING id, idem_key, scope_user_id, scope_endpoint, request_hash, status, attempt,
	response_code, response_body, response_body_raw, response_headers,
	created_at, locked_at, locked_until, expires_at,
	expires_at < now() AS expired, locked_until < now() AS lease_over
