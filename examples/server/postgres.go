package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/migrations"
)

// minPoolConns is the pool size unless the DSN sets pool_max_conns: a
// transactional order holds a connection for its whole handler, and claims,
// records and replays audits need their own.
const minPoolConns = 20

// connectTimeout bounds dialling the database, including the pool's own
// background connections, unless the DSN sets connect_timeout.
const connectTimeout = 5 * time.Second

// schemaSQL creates the example's own tables. The idempotency_keys table is
// the library's (migrations.Migrate).
const schemaSQL = `
CREATE TABLE IF NOT EXISTS demo_users (
    id         BIGSERIAL   PRIMARY KEY,
    name       TEXT        NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS paper_orders (
    id              BIGSERIAL     PRIMARY KEY,
    user_id         BIGINT        NOT NULL,
    symbol          TEXT          NOT NULL,
    side            TEXT          NOT NULL CHECK (side IN ('buy', 'sell')),
    qty             BIGINT        NOT NULL CHECK (qty > 0),
    status          TEXT          NOT NULL,
    fill_price      NUMERIC(14,2) NOT NULL,
    client_order_id TEXT,
    created_at      TIMESTAMPTZ   NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS paper_orders_user_id_idx ON paper_orders (user_id, id);
CREATE TABLE IF NOT EXISTS audit_log (
    id         BIGSERIAL   PRIMARY KEY,
    user_id    BIGINT,
    action     TEXT        NOT NULL,
    context    JSONB       NOT NULL DEFAULT '{}',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS audit_log_user_id_idx ON audit_log (user_id, id);
`

// poolConfig parses dsn and sizes the pool: at least minPoolConns unless the
// DSN says pool_max_conns itself.
func poolConfig(dsn string) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		pc.MaxConns = max(pc.MaxConns, minPoolConns)
	}
	if pc.ConnConfig.ConnectTimeout == 0 { // the DSN's connect_timeout wins
		pc.ConnConfig.ConnectTimeout = connectTimeout
	}
	return pc, nil
}

// connectPostgres opens a pool on dsn and waits up to wait for the database
// to answer, so the server can start alongside its database.
func connectPostgres(ctx context.Context, dsn string, wait time.Duration, log *slog.Logger) (*pgxpool.Pool, error) {
	pc, err := poolConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("database pool: %w", err)
	}
	deadline := time.Now().Add(wait)
	backoff := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		pingDeadline := time.Now().Add(5 * time.Second)
		if deadline.Before(pingDeadline) {
			pingDeadline = deadline
		}
		pingCtx, cancel := context.WithDeadline(ctx, pingDeadline)
		err = pool.Ping(pingCtx)
		cancel()
		if err == nil {
			return pool, nil
		}
		if ctx.Err() != nil {
			pool.Close()
			return nil, fmt.Errorf("start-up interrupted while waiting for the database: %w", ctx.Err())
		}
		left := time.Until(deadline)
		if left <= 0 {
			pool.Close()
			return nil, fmt.Errorf("database unreachable at %s:%d: gave up after %v (%d attempts): %w",
				pc.ConnConfig.Host, pc.ConnConfig.Port, wait, attempt, err)
		}
		pause := min(backoff, left)
		log.Warn("database not reachable yet; retrying", "attempt", attempt, "retry_in", pause.String(), "error", err)
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// migrate applies the library's migrations, then creates the example's
// tables. Replicas starting together serialise on an advisory lock, since
// CREATE TABLE IF NOT EXISTS is not safe against itself.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := migrations.Migrate(ctx, pool); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('idemkit example schema'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schemaSQL)
		return err
	})
	if err != nil {
		return fmt.Errorf("create the example's tables: %w", err)
	}
	return nil
}

// migrateVia migrates through a pool of its own on migrateURL, a direct
// connection when pool goes through a transaction pooler (migrations hold a
// session advisory lock that must not leak to other clients), or through
// pool when migrateURL is empty.
func migrateVia(ctx context.Context, pool *pgxpool.Pool, migrateURL string, wait time.Duration, log *slog.Logger) error {
	if migrateURL == "" {
		return migrate(ctx, pool)
	}
	direct, err := connectPostgres(ctx, migrateURL, wait, log)
	if err != nil {
		return fmt.Errorf("migration database: %w", err)
	}
	defer direct.Close()
	return migrate(ctx, direct)
}

// pgRepo is the repo of the PostgreSQL mode. Every call runs under timeout
// (the store timeout), so a database that stops answering turns into 503
// database_unavailable, never a hung request.
type pgRepo struct {
	pool    *pgxpool.Pool
	timeout time.Duration
}

// bound returns ctx with the repo's deadline.
func (p *pgRepo) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.timeout)
}

func (p *pgRepo) createUser(ctx context.Context, name string) (int64, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	var id int64
	err := p.pool.QueryRow(ctx, `INSERT INTO demo_users (name) VALUES ($1) RETURNING id`, name).Scan(&id)
	return id, err
}

// insertOrderSQL and insertOrderPlacedSQL are an order's two writes (the
// load benchmark's pgbench scripts read them from this file).
//
// $1 user, $2 symbol, $3 side, $4 qty, $5 status, $6 fill price,
// $7 client order id (empty: none).
const insertOrderSQL = `INSERT INTO paper_orders (user_id, symbol, side, qty, status, fill_price, client_order_id)
	VALUES ($1, $2, $3, $4, $5, $6, NULLIF($7, ''))
	RETURNING id, created_at`

// $1 user, $2 context (JSON).
const insertOrderPlacedSQL = `INSERT INTO audit_log (user_id, action, context) VALUES ($1, 'order_placed', $2)`

// placeOrder writes through the transactional route's transaction, so the
// order, its audit row and the key's completed record commit together, or
// none of them. Without one (a caller outside that route) it opens its own.
func (p *pgRepo) placeOrder(ctx context.Context, o order) (order, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	write := func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, insertOrderSQL,
			o.UserID, o.Symbol, o.Side, o.Qty, o.Status, o.FillPrice, o.ClientOrderID,
		).Scan(&o.ID, &o.CreatedAt)
		if err != nil {
			return err
		}
		o.CreatedAt = o.CreatedAt.UTC()
		_, err = tx.Exec(ctx, insertOrderPlacedSQL, o.UserID, orderPlacedContext(o))
		return err
	}
	if tx, ok := idempotency.TxFromContext(ctx); ok {
		return o, write(tx)
	}
	return o, pgx.BeginFunc(ctx, p.pool, write)
}

const orderColumns = `id, user_id, symbol, side, qty, status, fill_price::float8, COALESCE(client_order_id, ''), created_at`

func scanOrder(row pgx.Row) (order, error) {
	var o order
	err := row.Scan(&o.ID, &o.UserID, &o.Symbol, &o.Side, &o.Qty, &o.Status, &o.FillPrice, &o.ClientOrderID, &o.CreatedAt)
	o.CreatedAt = o.CreatedAt.UTC()
	return o, err
}

func (p *pgRepo) orders(ctx context.Context, userID int64) ([]order, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	rows, err := p.pool.Query(ctx, `SELECT `+orderColumns+` FROM paper_orders WHERE user_id = $1 ORDER BY id`, userID)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (order, error) { return scanOrder(row) })
	if out == nil {
		out = []order{}
	}
	return out, err
}

func (p *pgRepo) order(ctx context.Context, userID, id int64) (order, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	o, err := scanOrder(p.pool.QueryRow(ctx, `SELECT `+orderColumns+` FROM paper_orders WHERE id = $1 AND user_id = $2`, id, userID))
	if errors.Is(err, pgx.ErrNoRows) {
		return order{}, errNotFound
	}
	return o, err
}

func (p *pgRepo) orderByClientID(ctx context.Context, userID int64, clientOrderID string) (order, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	o, err := scanOrder(p.pool.QueryRow(ctx, `SELECT `+orderColumns+` FROM paper_orders
		WHERE client_order_id = $1 AND user_id = $2 ORDER BY id LIMIT 1`, clientOrderID, userID))
	if errors.Is(err, pgx.ErrNoRows) {
		return order{}, errNotFound
	}
	return o, err
}

func (p *pgRepo) audit(ctx context.Context, userID int64, action string, details any) error {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	var uid *int64
	if userID != 0 {
		uid = &userID
	}
	_, err := p.pool.Exec(ctx, `INSERT INTO audit_log (user_id, action, context) VALUES ($1, $2, $3)`, uid, action, details)
	return err
}

func (p *pgRepo) auditLog(ctx context.Context, userID int64) ([]auditEntry, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	rows, err := p.pool.Query(ctx, `SELECT id, user_id, action, context, created_at FROM audit_log WHERE user_id = $1 ORDER BY id`, userID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (auditEntry, error) {
		var e auditEntry
		var raw []byte
		err := row.Scan(&e.ID, &e.UserID, &e.Action, &raw, &e.CreatedAt)
		e.Context = json.RawMessage(raw)
		return e, err
	})
}
