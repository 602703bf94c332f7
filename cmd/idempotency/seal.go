package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/seal"
)

// envSealKeys holds the seal keys (README "Sealing stored responses"),
// the format the example server reads: ID:KEY entries, the first active.
const envSealKeys = "IDEMPOTENCY_SEAL_KEYS"

// sealKeys returns the keys of --seal-keys-file, else of
// IDEMPOTENCY_SEAL_KEYS; nil when neither is given. A malformed list is a
// usage error that names the entry by position and ID, never its text.
func (c *cli) sealKeys() (*seal.Keyring, error) {
	text, from := c.getenv(envSealKeys), envSealKeys
	if c.g.sealKeysFile.set {
		b, err := os.ReadFile(c.g.sealKeysFile.v)
		if err != nil {
			return nil, usagef("--seal-keys-file: %v", err)
		}
		text, from = string(b), "--seal-keys-file "+c.g.sealKeysFile.v
	} else if text == "" {
		return nil, nil
	}
	k, err := seal.Parse(text)
	if err != nil {
		return nil, usagef("%s: %v", from, err)
	}
	return k, nil
}

// readStore is the store that export and inspect read through: store, or
// with seal keys given, a sealing store around it, which opens what it
// reads.
func (c *cli) readStore(ctx context.Context, store idempotency.Store) (idempotency.Store, error) {
	keys, err := c.sealKeys()
	if err != nil || keys == nil {
		return store, err
	}
	return idempotency.NewSealingStore(ctx, store, keys)
}

// sealStatsSQL counts completed keys by the key id their response is
// sealed with (NULL: plaintext).
const sealStatsSQL = `SELECT coalesce(seal_key_id, ''), count(*) FROM idempotency_keys
WHERE status = 'completed' GROUP BY seal_key_id`

// nonceWarning is the count of values past which stats warns about a key:
// half the 2^32 values one key may seal with random 96-bit nonces (NIST
// SP 800-38D, 8.3).
const nonceWarning = 1 << 31

// sealStats reads sealStatsSQL.
func sealStats(ctx context.Context, pool *pgxpool.Pool) (map[string]int64, error) {
	rows, err := pool.Query(ctx, sealStatsSQL)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	var (
		id string
		n  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		out[id] = n
		return nil
	})
	return out, err
}

// warnNonceBudget warns, on stderr, of every key id that seals at least
// nonceWarning of the rows still in the table (it sealed at least as many
// values).
func (c *cli) warnNonceBudget(byKey map[string]int64) {
	for _, id := range slices.Sorted(maps.Keys(byKey)) {
		if id != "" && byKey[id] >= nonceWarning {
			fmt.Fprintf(c.stderr, "warning: seal key id %s seals %d stored values, past 2^31: add a new active key and run reseal "+
				"(one key may seal at most 2^32 values with random nonces)\n", id, byKey[id])
		}
	}
}

// sealedError is the error for a row read sealed without the key to open
// it.
func sealedError(rec idempotency.Record) error {
	return fmt.Errorf("row %d (key %s, endpoint %q) is sealed with key id %q: give that key in %s or --seal-keys-file",
		rec.ID, rec.Key, rec.Endpoint, rec.Response.SealKeyID, envSealKeys)
}
