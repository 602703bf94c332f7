SELECT set_config('lock_timeout', current_setting('idempotency.saved_lock_timeout'), true)
