package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/internal/seal"
	"github.com/idemkit/idempotency/internal/storedbody"
)

func resealHelp(w io.Writer) {
	fmt.Fprint(w, `Usage: idempotency reseal [--user ID | --unscoped] [--batch N] [--dry-run] [flags]

Seals every completed key's response with the active seal key (the first of
IDEMPOTENCY_SEAL_KEYS or --seal-keys-file): responses sealed with an older
key, and plaintext ones recorded before sealing was turned on. Run it after
every replica seals with the new key (README "Sealing stored responses",
the rotation runbook); once stats shows no row under an old key id, that
key can be retired.

It works in batches of --batch rows, in key order, each batch one short
transaction; every row is written only if it is still as read (same
attempt, still completed, same key id), so a takeover or completion that
happens meanwhile is never overwritten: such a row is counted as changed
and left alone. An interrupted run is resumed by running it again (rows
already sealed with the active key are skipped). A row that does not open
with the keys given is reported (id and key id) and left as it is; the run
then exits with status 1. A second run with nothing left reseals nothing.
--dry-run reads and opens every row it would reseal, writes nothing, and
reports the same counts. --user ID or --unscoped reseals one scope only
(without either: every scope). It works on PostgreSQL and MySQL/MariaDB
(there in id order).

Example:
  IDEMPOTENCY_SEAL_KEYS="k2:...,k1:..." idempotency reseal --batch 500
`)
}

// resealSelectSQL reads one batch of completed rows not sealed with the
// active key, after the cursor, in primary-key order (an index range
// scan).
//
// $1 cursor scope, $2 cursor key, $3 cursor endpoint, $4 active key id,
// $5 batch size.
const resealSelectSQL = `SELECT scope_user_id, id, attempt, idem_key, scope_endpoint, encode(request_hash, 'hex'),
	response_code, response_body, response_body_raw, response_headers, seal_key_id
FROM idempotency_keys
WHERE (scope_user_id, idem_key, scope_endpoint) > ($1, $2, $3) AND status = 'completed' AND seal_key_id IS DISTINCT FROM $4
ORDER BY scope_user_id, idem_key, scope_endpoint
LIMIT $5`

// resealUpdateSQL writes one row's new seal, fenced on the row as read:
// its attempt (a takeover bumps it), completed, and its key id (another
// reseal changes it).
//
// $1 scope, $2 id, $3 attempt, $4 key id read (NULL: plaintext), $5 sealed
// value, $6 active key id, $7 key, $8 endpoint.
const resealUpdateSQL = `UPDATE idempotency_keys SET
	response_body = NULL, response_headers = NULL, response_body_raw = $5, seal_key_id = $6
WHERE scope_user_id = $1 AND idem_key = $7 AND scope_endpoint = $8 AND id = $2 AND attempt = $3 AND status = 'completed'
	AND seal_key_id IS NOT DISTINCT FROM $4`

// resealScopedSQL is resealSelectSQL within one scope ($1): the cursor
// moves over the rest of the primary key.
const resealScopedSQL = `SELECT scope_user_id, id, attempt, idem_key, scope_endpoint, encode(request_hash, 'hex'),
	response_code, response_body, response_body_raw, response_headers, seal_key_id
FROM idempotency_keys
WHERE scope_user_id = $1 AND (idem_key, scope_endpoint) > ($2, $3) AND status = 'completed' AND seal_key_id IS DISTINCT FROM $4
ORDER BY idem_key, scope_endpoint
LIMIT $5`

// resealCounts is what reseal did, and its --json output.
type resealCounts struct {
	ActiveKeyID string `json:"active_key_id"`
	DryRun      bool   `json:"dry_run"`
	Batches     int64  `json:"batches"`
	Read        int64  `json:"read"`
	Resealed    int64  `json:"resealed"`   // written (with --dry-run: would be)
	Changed     int64  `json:"changed"`    // changed since read: left alone
	Unopenable  int64  `json:"unopenable"` // do not open with the keys given: left alone
}

func runReseal(ctx context.Context, c *cli, args []string) error {
	flags := c.flagSet("reseal")
	batch := flags.Int("batch", 500, "rows per batch, `N` from 1 to 10000")
	dryRun := flags.Bool("dry-run", false, "read and open the rows, write nothing")
	user, unscoped := scopeVars(flags, "reseal")
	pos, err := c.parse(flags, args, resealHelp)
	if err != nil {
		return err
	}
	if err := noArgs("reseal", pos); err != nil {
		return err
	}
	scope, scoped, err := optionalScope("reseal", *user, *unscoped)
	if err != nil {
		return err
	}
	if *batch < 1 || *batch > 10000 {
		return usagef("--batch must be from 1 to 10000, got %d", *batch)
	}
	keys, err := c.sealKeys()
	if err != nil {
		return err
	}
	if keys == nil {
		return usagef("no seal keys: set %s or --seal-keys-file (the first key is the one rows are sealed with)", envSealKeys)
	}
	d, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer d.Close()

	r := resealer{c: c, d: d, sealer: seal.New(keys), batch: *batch, scoped: scoped, scope: scope}
	r.n.ActiveKeyID, r.n.DryRun = keys.IDs()[0], *dryRun
	if err := r.run(ctx); err != nil {
		return err
	}
	if c.g.json {
		if err := c.writeJSON(r.n); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.stdout, "%s: %d read, %d %s to key id %s, %d changed meanwhile (left alone), %d do not open\n",
			map[bool]string{true: "dry run", false: "done"}[*dryRun], r.n.Read, r.n.Resealed,
			map[bool]string{true: "would be resealed", false: "resealed"}[*dryRun], r.n.ActiveKeyID, r.n.Changed, r.n.Unopenable)
	}
	if r.n.Unopenable > 0 {
		return fmt.Errorf("%d of the rows read do not open with the keys given (listed above); they stay as they are", r.n.Unopenable)
	}
	return nil
}

// resealer runs reseal's batches.
type resealer struct {
	c      *cli
	d      *database
	sealer *seal.Sealer
	batch  int
	scoped bool // scope is the only scope to reseal
	n      resealCounts
	// the cursor: the last row read (on MySQL its id)
	scope, key, endpoint string
	id                   int64
}

// resealRow is one row read, and its new seal.
type resealRow struct {
	row       seal.Row
	keyID     *string // as read; nil for plaintext
	code      *int16
	body, raw []byte
	headers   []byte
	sealed    []byte
}

func (r *resealer) run(ctx context.Context) error {
	for {
		rows, err := r.read(ctx)
		if err != nil {
			return r.c.dbError(ctx, "read a batch", err)
		}
		if len(rows) == 0 {
			return nil
		}
		r.n.Batches++
		todo := r.sealAll(ctx, rows)
		if !r.n.DryRun && len(todo) > 0 {
			if err := r.write(ctx, todo); err != nil {
				return r.c.dbError(ctx, "write a batch", err)
			}
		} else {
			r.n.Resealed += int64(len(todo))
		}
		fmt.Fprintf(r.c.stderr, "batch %d: %d read so far, %d resealed, %d changed, %d do not open (through user %q, key %q, endpoint %q)\n",
			r.n.Batches, r.n.Read, r.n.Resealed, r.n.Changed, r.n.Unopenable, r.scope, r.key, r.endpoint)
		if len(rows) < r.batch {
			return nil
		}
	}
}

// read reads the next batch and moves the cursor past it.
func (r *resealer) read(ctx context.Context) ([]*resealRow, error) {
	sctx, cancel := r.c.statementContext(ctx)
	defer cancel()
	q, args := resealSelectSQL, []any{r.scope, r.key, r.endpoint, r.n.ActiveKeyID, r.batch}
	switch {
	case r.d.sqlDB != nil:
		q, args = r.mysqlSelect()
	case r.scoped:
		q = resealScopedSQL
	}
	var out []*resealRow
	var x resealRow
	err := r.d.query(sctx, q, args, []any{&x.row.Scope, &x.row.ID, &x.row.Attempt, &x.row.Key, &x.row.Endpoint,
		&x.row.RequestHash, &x.code, &x.body, &x.raw, &x.headers, &x.keyID}, func() error {
		row := x
		out = append(out, &row)
		r.scope, r.key, r.endpoint, r.id = x.row.Scope, x.row.Key, x.row.Endpoint, x.row.ID
		// The next scan must not write through what this row kept.
		x.code, x.keyID, x.body, x.raw, x.headers = nil, nil, nil, nil, nil
		return nil
	})
	r.n.Read += int64(len(out))
	return out, err
}

// sealAll seals each row with the active key and returns those it could
// open; the others are reported and counted.
func (r *resealer) sealAll(ctx context.Context, rows []*resealRow) []*resealRow {
	var todo []*resealRow
	for _, x := range rows {
		if x.code != nil {
			x.row.Status = int(*x.code)
		}
		p, err := r.plain(ctx, x)
		if err == nil {
			_, x.sealed, err = r.sealer.Seal(ctx, x.row, p)
		}
		if err != nil {
			r.n.Unopenable++
			fmt.Fprintf(r.c.stderr, "row %d (user %q, key id %s) left as it is: %v\n", x.row.ID, x.row.Scope, keyIDName(x.keyID), err)
			continue
		}
		todo = append(todo, x)
	}
	return todo
}

// plain returns the response a row holds: opened, or as stored in
// plaintext.
func (r *resealer) plain(ctx context.Context, x *resealRow) (seal.Plain, error) {
	if x.keyID != nil {
		return r.sealer.Open(ctx, x.row, *x.keyID, x.raw)
	}
	var p seal.Plain
	var kind storedbody.Kind
	p.Body, kind = storedbody.Decode(x.body, x.raw)
	p.Kind = uint8(kind)
	if x.headers != nil {
		var h http.Header
		if err := json.Unmarshal(x.headers, &h); err != nil {
			return seal.Plain{}, errors.New("its response_headers are not an object of string arrays")
		}
		p.Header = h
	}
	return p, nil
}

// write writes a batch's seals in one pipelined transaction, each fenced
// on its row as read.
func (r *resealer) write(ctx context.Context, todo []*resealRow) error {
	sctx, cancel := r.c.statementContext(ctx)
	defer cancel()
	if r.d.sqlDB != nil {
		return r.writeMySQL(sctx, todo)
	}
	b := &pgx.Batch{}
	for _, x := range todo {
		b.Queue(resealUpdateSQL, x.row.Scope, x.row.ID, x.row.Attempt, x.keyID, x.sealed, r.n.ActiveKeyID, x.row.Key, x.row.Endpoint)
	}
	br := r.d.pool.SendBatch(sctx, b)
	var written int64
	for range todo {
		tag, err := br.Exec()
		if err != nil {
			_ = br.Close()
			return err
		}
		written += tag.RowsAffected()
	}
	if err := br.Close(); err != nil {
		return err
	}
	r.n.Resealed += written
	r.n.Changed += int64(len(todo)) - written
	return nil
}

// keyIDName names a row's key id for messages.
func keyIDName(id *string) string {
	if id == nil {
		return "none (plaintext)"
	}
	return fmt.Sprintf("%q", *id)
}
