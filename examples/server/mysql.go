package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idempotency/migrations"
	"github.com/idemkit/idempotency/sqlstore"
)

// The MySQL/MariaDB mode: a mysql:// DATABASE_URL (or a go-sql-driver DSN)
// selects sqlstore's MySQL dialect for the idempotency store and the
// example's own tables, with orders transactional as on PostgreSQL.

// mysqlSchema creates the example's own tables, one statement each (the
// store's connection has no multiStatements).
var mysqlSchema = []string{
	`CREATE TABLE IF NOT EXISTS demo_users (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name       VARCHAR(255) NOT NULL DEFAULT '',
    created_at DATETIME(6)  NOT NULL DEFAULT UTC_TIMESTAMP(6)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4`,
	`CREATE TABLE IF NOT EXISTS paper_orders (
    id              BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    user_id         BIGINT         NOT NULL,
    symbol          VARCHAR(32)    NOT NULL,
    side            VARCHAR(4)     NOT NULL CHECK (side IN ('buy', 'sell')),
    qty             BIGINT         NOT NULL CHECK (qty > 0),
    status          VARCHAR(16)    NOT NULL,
    fill_price      DECIMAL(14,2)  NOT NULL,
    client_order_id VARBINARY(255) NULL,
    created_at      DATETIME(6)    NOT NULL DEFAULT UTC_TIMESTAMP(6),
    KEY paper_orders_user_id_idx (user_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4`,
	`CREATE TABLE IF NOT EXISTS audit_log (
    id         BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    user_id    BIGINT      NULL,
    action     VARCHAR(64) NOT NULL,
    context    LONGTEXT    NOT NULL CHECK (JSON_VALID(context)),
    created_at DATETIME(6) NOT NULL DEFAULT UTC_TIMESTAMP(6),
    KEY audit_log_user_id_idx (user_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4`,
}

// isMySQLURL reports a DATABASE_URL for the MySQL mode: the mysql://
// scheme, or a go-sql-driver DSN (user@tcp(host:port)/db).
func isMySQLURL(u string) bool {
	return strings.HasPrefix(u, "mysql://") || strings.Contains(u, "@tcp(") || strings.HasPrefix(u, "tcp(")
}

// mysqlConfig parses a mysql:// URL or a DSN, with the dial timeout the
// DSN does not name set.
func mysqlConfig(u string) (*mysql.Config, error) {
	dsn, err := sqlstore.MySQLDSN(u)
	if err != nil {
		return nil, err
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	cfg.ParseTime = true
	if cfg.Timeout == 0 {
		cfg.Timeout = connectTimeout
	}
	return cfg, nil
}

// connectMySQL opens a pool on u, sized as the PostgreSQL one, migrates,
// and waits up to wait for the database, as connectPostgres does.
func connectMySQL(ctx context.Context, u string, wait time.Duration, log *slog.Logger) (*sql.DB, error) {
	cfg, err := mysqlConfig(u)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(minPoolConns)
	db.SetMaxIdleConns(minPoolConns)
	deadline := time.Now().Add(wait)
	backoff := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		pingCtx, cancel := context.WithDeadline(ctx, minTime(deadline, time.Now().Add(5*time.Second)))
		err = db.PingContext(pingCtx)
		cancel()
		if err == nil {
			break
		}
		left := time.Until(deadline)
		if ctx.Err() != nil || left <= 0 {
			_ = db.Close()
			return nil, fmt.Errorf("database unreachable at %s: gave up after %v (%d attempts): %w", cfg.Addr, wait, attempt, err)
		}
		pause := min(backoff, left)
		log.Warn("database not reachable yet; retrying", "attempt", attempt, "retry_in", pause.String(), "error", err)
		select {
		case <-time.After(pause):
		case <-ctx.Done():
		}
		backoff = min(2*backoff, 2*time.Second)
	}
	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := migrations.MigrateMySQL(mctx, cfg.FormatDSN()); err != nil {
		_ = db.Close()
		return nil, err
	}
	for _, stmt := range mysqlSchema {
		if _, err := db.ExecContext(mctx, stmt); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("create the example's tables: %w", err)
		}
	}
	return db, nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// mysqlRepo is the repo of the MySQL mode; every call runs under the store
// timeout, as pgRepo's do.
type mysqlRepo struct {
	db      *sql.DB
	timeout time.Duration
}

func (p *mysqlRepo) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.timeout)
}

func (p *mysqlRepo) createUser(ctx context.Context, name string) (int64, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	r, err := p.db.ExecContext(ctx, `INSERT INTO demo_users (name) VALUES (?)`, name)
	if err != nil {
		return 0, err
	}
	return r.LastInsertId()
}

// dbtx is what an order writes through: the route's *sqlstore.Tx, or a
// transaction of its own.
type dbtx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// placeOrder writes through the transactional route's *sqlstore.Tx, so
// the order, its audit row and the key's record commit together.
func (p *mysqlRepo) placeOrder(ctx context.Context, o order) (order, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	write := func(tx dbtx) error {
		var coid any
		if o.ClientOrderID != "" {
			coid = o.ClientOrderID
		}
		r, err := tx.ExecContext(ctx, `INSERT INTO paper_orders (user_id, symbol, side, qty, status, fill_price, client_order_id)
	VALUES (?, ?, ?, ?, ?, ?, ?)`, o.UserID, o.Symbol, o.Side, o.Qty, o.Status, o.FillPrice, coid)
		if err != nil {
			return err
		}
		if o.ID, err = r.LastInsertId(); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, `SELECT created_at FROM paper_orders WHERE id = ?`, o.ID).Scan(&o.CreatedAt); err != nil {
			return err
		}
		o.CreatedAt = o.CreatedAt.UTC()
		details, err := json.Marshal(orderPlacedContext(o))
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO audit_log (user_id, action, context) VALUES (?, 'order_placed', ?)`, o.UserID, string(details))
		return err
	}
	if tx, ok := sqlstore.TxFromContext(ctx); ok {
		return o, write(tx)
	}
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return o, err
	}
	if err := write(tx); err != nil {
		_ = tx.Rollback()
		return o, err
	}
	return o, tx.Commit()
}

const mysqlOrderColumns = `id, user_id, symbol, side, qty, status, fill_price, COALESCE(client_order_id, ''), created_at`

func scanMySQLOrder(row interface{ Scan(...any) error }) (order, error) {
	var o order
	err := row.Scan(&o.ID, &o.UserID, &o.Symbol, &o.Side, &o.Qty, &o.Status, &o.FillPrice, &o.ClientOrderID, &o.CreatedAt)
	o.CreatedAt = o.CreatedAt.UTC()
	return o, err
}

func (p *mysqlRepo) orders(ctx context.Context, userID int64) ([]order, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	rows, err := p.db.QueryContext(ctx, `SELECT `+mysqlOrderColumns+` FROM paper_orders WHERE user_id = ? ORDER BY id`, userID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []order{}
	for rows.Next() {
		o, err := scanMySQLOrder(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

func (p *mysqlRepo) order(ctx context.Context, userID, id int64) (order, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	o, err := scanMySQLOrder(p.db.QueryRowContext(ctx, `SELECT `+mysqlOrderColumns+` FROM paper_orders WHERE id = ? AND user_id = ?`, id, userID))
	if errors.Is(err, sql.ErrNoRows) {
		return order{}, errNotFound
	}
	return o, err
}

func (p *mysqlRepo) orderByClientID(ctx context.Context, userID int64, clientOrderID string) (order, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	o, err := scanMySQLOrder(p.db.QueryRowContext(ctx, `SELECT `+mysqlOrderColumns+` FROM paper_orders
		WHERE client_order_id = ? AND user_id = ? ORDER BY id LIMIT 1`, clientOrderID, userID))
	if errors.Is(err, sql.ErrNoRows) {
		return order{}, errNotFound
	}
	return o, err
}

func (p *mysqlRepo) audit(ctx context.Context, userID int64, action string, details any) error {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	var uid any
	if userID != 0 {
		uid = userID
	}
	b, err := json.Marshal(details)
	if err != nil {
		return err
	}
	_, err = p.db.ExecContext(ctx, `INSERT INTO audit_log (user_id, action, context) VALUES (?, ?, ?)`, uid, action, string(b))
	return err
}

func (p *mysqlRepo) auditLog(ctx context.Context, userID int64) ([]auditEntry, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	rows, err := p.db.QueryContext(ctx, `SELECT id, user_id, action, context, created_at FROM audit_log WHERE user_id = ? ORDER BY id`, userID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []auditEntry
	for rows.Next() {
		var e auditEntry
		var raw []byte
		if err := rows.Scan(&e.ID, &e.UserID, &e.Action, &raw, &e.CreatedAt); err != nil {
			return nil, err
		}
		e.Context = json.RawMessage(raw)
		out = append(out, e)
	}
	return out, rows.Err()
}
