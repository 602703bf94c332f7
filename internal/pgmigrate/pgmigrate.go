// Package pgmigrate runs golang-migrate over a caller's pgxpool for the
// idempotency migrations, so the library's Migrate and the operator CLI
// apply them the same way.
//
// golang-migrate takes no context, and it serialises runs with a session
// advisory lock (pg_advisory_lock) that it waits for without a bound. A
// Migrator therefore (1) bounds the wait for that lock with the caller's
// context, by cancelling the waiting statement and closing its connection
// when the context ends; and (2) closes every
// connection it used instead of returning it to the pool, so a session lock
// can never stay behind on a pooled connection.
package pgmigrate

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// HistoryTable is the table, in the pool's current schema, where applied
// versions are recorded. It is not golang-migrate's default
// schema_migrations, so the host application's own history is never touched.
const HistoryTable = "idempotency_schema_migrations"

// noLockTimeout replaces golang-migrate's own lock timeout (15s), after which
// it stops waiting but leaves the lock request running; the caller's context
// bounds the wait instead.
const noLockTimeout = 100 * 365 * 24 * time.Hour

// Migrator applies a set of migrations to the current schema of a pool's
// connections. It is not safe for concurrent use; Close it when done.
type Migrator struct {
	m     *migrate.Migrate
	conns *connSet
	lock  *lockDriver
}

// New returns a Migrator for the migrations at the root of migrations
// (files named like 000001_name.up.sql), applied to the current schema of
// pool's connections (the first existing schema of their search_path) and
// recorded in HistoryTable there, which New creates if it is missing. The
// pool stays the caller's: the Migrator closes the connections it borrowed,
// never the pool.
//
// golang-migrate's advisory lock id is derived from the database, the
// schema and HistoryTable, so Migrators on different schemas of one
// database never wait for each other, while two on the same schema (two
// replicas starting) apply each migration once.
//
// ctx bounds New, including any wait for another Migrator's lock.
func New(ctx context.Context, pool *pgxpool.Pool, migrations fs.FS) (*Migrator, error) {
	src, err := iofs.New(migrations, ".")
	if err != nil {
		return nil, fmt.Errorf("pgmigrate: read migrations: %w", err)
	}
	// Ask for the names here, within ctx, so golang-migrate does not.
	var dbName, schema *string
	if err := pool.QueryRow(ctx, `SELECT current_database(), current_schema()`).Scan(&dbName, &schema); err != nil {
		return nil, errors.Join(fmt.Errorf("pgmigrate: connect: %w", err), src.Close())
	}
	if schema == nil {
		return nil, errors.Join(errors.New("pgmigrate: no current schema: no schema of the connections' search_path exists"), src.Close())
	}

	conns := &connSet{conns: make(map[*ownedConn]struct{})}
	db := sql.OpenDB(connector{Connector: stdlib.GetPoolConnector(pool), set: conns})
	db.SetMaxIdleConns(0)

	// WithInstance creates HistoryTable under golang-migrate's lock,
	// waiting for it without a bound: end that wait when ctx ends.
	stop := context.AfterFunc(ctx, conns.abort)
	inner, err := pgxmigrate.WithInstance(db, &pgxmigrate.Config{
		MigrationsTable: HistoryTable,
		DatabaseName:    *dbName,
		SchemaName:      *schema,
	})
	if !stop() {
		err = errors.Join(ctx.Err(), err)
		if inner != nil {
			err = errors.Join(err, inner.Close())
			inner = nil
		}
	}
	if err != nil {
		// On failure WithInstance keeps the connection it took: close it
		// here, or the pool would wait for it forever.
		return nil, errors.Join(fmt.Errorf("pgmigrate: open database: %w", err), db.Close(), conns.closeAll(), src.Close())
	}
	lock := &lockDriver{Driver: inner, conns: conns}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", lock)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("pgmigrate: %w", err), inner.Close(), conns.closeAll(), src.Close())
	}
	m.LockTimeout = noLockTimeout
	return &Migrator{m: m, conns: conns, lock: lock}, nil
}

// Up applies every up migration not yet applied. Having nothing to apply is
// success. See Run for how ctx bounds it.
func (g *Migrator) Up(ctx context.Context) error {
	err := g.Run(ctx, func(m *migrate.Migrate) error { return m.Up() })
	if errors.Is(err, migrate.ErrNoChange) {
		return nil
	}
	return err
}

// Run calls op with the underlying golang-migrate runner (for Up, Down,
// Steps, Version, Force), bounded by ctx: the wait for the migration lock
// ends when ctx ends, and once ctx has ended no further migration starts.
// A migration already running finishes; each runs in one implicit
// transaction. When ctx ended before op returned, Run returns ctx's error,
// and if it ended during the lock wait, the Migrator can only be closed.
func (g *Migrator) Run(ctx context.Context, op func(m *migrate.Migrate) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	g.lock.setContext(ctx)
	defer g.lock.clearContext()
	stop := context.AfterFunc(ctx, func() {
		select {
		case g.m.GracefulStop <- true:
		default:
		}
	})
	err := op(g.m)
	if !stop() {
		return errors.Join(ctx.Err(), err)
	}
	return err
}

// Close closes the connections the Migrator opened. The pool stays open.
func (g *Migrator) Close() error {
	srcErr, dbErr := g.m.Close()
	return errors.Join(srcErr, dbErr, g.conns.closeAll())
}

// lockDriver is golang-migrate's pgx driver with its Lock bounded by the
// context of the Run in progress.
type lockDriver struct {
	database.Driver
	conns *connSet

	mu  sync.Mutex
	ctx context.Context // of the Run in progress; nil outside Run
}

func (d *lockDriver) setContext(ctx context.Context) {
	d.mu.Lock()
	d.ctx = ctx
	d.mu.Unlock()
}

// clearContext ends a Run: a later Lock waits without a bound, as
// golang-migrate's own would.
func (d *lockDriver) clearContext() {
	d.mu.Lock()
	d.ctx = nil
	d.mu.Unlock()
}

// Lock takes golang-migrate's advisory lock; when the Run's context ends
// first, it closes the waiting connection, so the server drops the request.
func (d *lockDriver) Lock() error {
	d.mu.Lock()
	ctx := d.ctx
	d.mu.Unlock()
	if ctx == nil {
		return d.Driver.Lock()
	}
	stop := context.AfterFunc(ctx, d.conns.abort)
	err := d.Driver.Lock()
	if !stop() {
		return errors.Join(ctx.Err(), err)
	}
	return err
}

// connSet tracks the connections a Migrator's database/sql handle holds.
type connSet struct {
	mu    sync.Mutex
	conns map[*ownedConn]struct{}
}

// cancelTimeout bounds sending a cancel request when a wait is abandoned.
const cancelTimeout = 2 * time.Second

// abort makes every connection held give up what it is waiting for: it asks
// the server to cancel the statement (a backend waiting for a lock does not
// notice a closed socket until the lock is granted) and closes the socket,
// so the caller returns at once.
func (s *connSet) abort() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		pg := c.Conn.Conn().PgConn()
		ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
		_ = pg.CancelRequest(ctx)
		cancel()
		_ = pg.Conn().Close()
	}
}

// closeAll closes the connections database/sql has not closed, such as one
// golang-migrate kept after failing.
func (s *connSet) closeAll() error {
	s.mu.Lock()
	left := make([]*ownedConn, 0, len(s.conns))
	for c := range s.conns {
		left = append(left, c)
	}
	s.mu.Unlock()
	var errs []error
	for _, c := range left {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// connector hands out pool connections that are closed, not returned to the
// pool, when database/sql is done with them.
type connector struct {
	driver.Connector
	set *connSet
}

func (c connector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	sc, ok := dc.(*stdlib.Conn)
	if !ok {
		_ = dc.Close()
		return nil, fmt.Errorf("pgmigrate: unexpected driver connection %T", dc)
	}
	oc := &ownedConn{Conn: sc, set: c.set}
	c.set.mu.Lock()
	c.set.conns[oc] = struct{}{}
	c.set.mu.Unlock()
	return oc, nil
}

// ownedConn is a pool connection that is closed when released, so that no
// session state of golang-migrate (its advisory lock above all) can reach
// another user of the pool.
type ownedConn struct {
	*stdlib.Conn
	set *connSet

	once sync.Once
	err  error
}

// closeTimeout bounds the polite goodbye to the server on Close.
const closeTimeout = 5 * time.Second

// Close closes the connection and hands it back to the pool, which
// destroys it. Only the first call does anything.
func (c *ownedConn) Close() error {
	c.once.Do(func() {
		c.set.mu.Lock()
		delete(c.set.conns, c)
		c.set.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		_ = c.Conn.Conn().Close(ctx)
		c.err = c.Conn.Close()
	})
	return c.err
}
