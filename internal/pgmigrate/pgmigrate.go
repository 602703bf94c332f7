// Package pgmigrate runs golang-migrate over a caller's pgxpool for the
// idempotency migrations, so the library's Migrate and the operator CLI
// apply them the same way.
//
// golang-migrate takes no context, and it serialises runs with a session
// advisory lock (pg_advisory_lock) that it waits for without a bound. A
// Migrator therefore (1) bounds the wait for that lock with the caller's
// context, by cancelling the waiting statement and closing its connection
// when the context ends; (2) bounds every other lock wait (the history
// table's TRUNCATE, a migration's DROP or ALTER behind live traffic) by the
// context's deadline, with lock_timeout on its session, and cancels the
// running statement when the context ends; (3) puts the version back when
// a migration fails that way (golang-migrate would leave it "dirty": each
// of these migrations runs in one implicit transaction, so a failed one
// applied nothing); and (4) closes every connection it used instead of
// returning it to the pool, so a session lock can never stay behind on a
// pooled connection.
package pgmigrate

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idempotency/internal/sqlstate"
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
	err := g.Run(ctx, func(m *migrate.Migrate) error { return Stepwise(m, true) })
	if errors.Is(err, migrate.ErrNoChange) {
		return nil
	}
	return err
}

// Run calls op with the underlying golang-migrate runner (for Up, Down,
// Steps, Version, Force), bounded by ctx: the wait for the migration lock
// ends when ctx ends; no statement runs or waits for a lock longer than
// the time ctx had left when Run began (lock_timeout, statement_timeout:
// a Run of several statements can end somewhat past the deadline, never
// without bound); the statement running when ctx is
// cancelled is cancelled; and once ctx has ended no further migration
// starts. A migration that fails
// (each runs in one implicit transaction, so it applied nothing) leaves the
// version where it was, not dirty: it is put back before the lock is
// released, to the version read under the lock. When ctx ended before op
// returned, Run returns ctx's error with op's, and the Migrator can only be
// closed (golang-migrate remembers a stop for good).
func (g *Migrator) Run(ctx context.Context, op func(m *migrate.Migrate) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var limit time.Duration // 0: none
	if d, ok := ctx.Deadline(); ok {
		limit = max(time.Until(d), time.Millisecond)
	}
	if err := g.conns.setTimeouts(ctx, limit); err != nil {
		return fmt.Errorf("pgmigrate: set the session's timeouts: %w", err)
	}
	g.lock.begin(ctx)
	defer g.lock.clearContext()
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		select {
		case g.m.GracefulStop <- true:
		default:
		}
		// A deadline is the session's own timeouts' business; a cancel
		// (Ctrl-C) comes early and must reach the running statement.
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			g.conns.cancelStatements()
		}
	})
	err := op(g.m)
	ended := !stop()
	if ended {
		// A stop signal op did not consume would stop the next Run's op
		// before it starts, silently.
		<-fired
		select {
		case <-g.m.GracefulStop:
		default:
		}
	}
	err = errors.Join(err, g.lock.takeRepairError())
	if ended {
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
// context of the Run in progress, and the steps of that Run tracked, so
// that a step that failed part-way can be undone before the lock is
// released (Unlock): no other replica ever sees the dirty version.
type lockDriver struct {
	database.Driver
	conns *connSet

	mu  sync.Mutex
	ctx context.Context // of the Run in progress; nil outside Run

	// Steps of the Run in progress, from its first Lock on.
	locked       bool
	dirtyAtStart bool
	clean        int   // the last version known clean
	bodyFailed   bool  // a migration's body failed: nothing of it applied
	markFailed   *int  // marking this version clean failed after its body ran
	repairErr    error // a repair that failed, for Run to report
}

// begin starts a Run.
func (d *lockDriver) begin(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ctx = ctx
	d.locked, d.bodyFailed, d.markFailed, d.repairErr = false, false, nil, nil
}

// takeRepairError returns, and forgets, the error of a failed repair.
func (d *lockDriver) takeRepairError() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.repairErr
	d.repairErr = nil
	return err
}

// Run runs a migration's body, noting a failure.
func (d *lockDriver) Run(migration io.Reader) error {
	err := d.Driver.Run(migration)
	if err != nil {
		d.mu.Lock()
		d.bodyFailed = true
		d.mu.Unlock()
	}
	return err
}

// SetVersion records the version, noting what is known clean.
func (d *lockDriver) SetVersion(version int, dirty bool) error {
	err := d.Driver.SetVersion(version, dirty)
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case err == nil && !dirty:
		d.clean = version
	case err != nil && !dirty:
		d.markFailed = &version
	}
	return err
}

// repairTimeout bounds putting the version back after a failed step.
const repairTimeout = 5 * time.Second

// Unlock puts the version back after a step that failed part-way, then
// releases golang-migrate's lock. golang-migrate marks the version dirty
// before a migration and clean after it, so a failed step leaves it dirty.
// When the migration's body failed, nothing of it was applied (one
// implicit transaction): the version goes back to the last clean one. When
// only the clean mark failed, the body was applied: the version is marked
// clean. A Run that started dirty is left as it is (an operator's case).
func (d *lockDriver) Unlock() error {
	d.repair()
	return d.Driver.Unlock()
}

func (d *lockDriver) repair() {
	d.mu.Lock()
	locked, dirtyAtStart, clean, bodyFailed, markFailed, ctx := d.locked, d.dirtyAtStart, d.clean, d.bodyFailed, d.markFailed, d.ctx
	d.mu.Unlock()
	if !locked || dirtyAtStart || (!bodyFailed && markFailed == nil) {
		return
	}
	if ctx == nil {
		ctx = context.Background()
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), repairTimeout)
	defer cancel()
	var err error
	// The cancel request sent when ctx was cancelled can reach the server
	// after the statement it was meant for failed, and cancel the next one
	// instead: it cancels one statement only, so try again.
	for range 3 {
		// The session's timeouts may be spent: the repair has its own.
		if err = d.conns.setTimeouts(rctx, repairTimeout); err == nil {
			err = d.putBack(clean, bodyFailed, markFailed)
		}
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || sqlstate.Postgres(pgErr.Code) != sqlstate.StatementTimeout { // query_canceled
			break
		}
	}
	d.mu.Lock()
	d.bodyFailed, d.markFailed = false, nil
	if err != nil {
		d.repairErr = fmt.Errorf("pgmigrate: could not put the version back (it is left dirty): %w", err)
	}
	d.mu.Unlock()
}

// putBack reads the version, under the lock, and sets the one the failed
// step leaves.
func (d *lockDriver) putBack(clean int, bodyFailed bool, markFailed *int) error {
	v, dirty, err := d.Driver.Version()
	switch {
	case err != nil:
		return err
	case !dirty:
		return nil
	case bodyFailed:
		return d.Driver.SetVersion(clean, false)
	case markFailed != nil && *markFailed == v:
		return d.Driver.SetVersion(v, false)
	}
	return nil
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
	if err == nil {
		err = d.recordStart()
	}
	return err
}

// recordStart records, on the Run's first Lock, the version as it stands under
// the lock: what a failed step is put back to.
func (d *lockDriver) recordStart() error {
	d.mu.Lock()
	first := !d.locked
	d.mu.Unlock()
	if !first {
		return nil
	}
	v, dirty, err := d.Driver.Version()
	if err != nil {
		return errors.Join(fmt.Errorf("pgmigrate: read the version: %w", err), d.Driver.Unlock())
	}
	d.mu.Lock()
	d.locked, d.dirtyAtStart, d.clean = true, dirty, v
	d.mu.Unlock()
	return nil
}

// connSet tracks the connections a Migrator's database/sql handle holds.
type connSet struct {
	mu      sync.Mutex
	conns   map[*ownedConn]struct{}
	aborted bool // abort ran: no connection is handed out after it
}

// errAborted is Connect's answer once the set was aborted.
var errAborted = errors.New("pgmigrate: the wait was abandoned (its context ended)")

// cancelTimeout bounds sending a cancel request when a wait is abandoned.
const cancelTimeout = 2 * time.Second

// setTimeouts sets lock_timeout and statement_timeout on every connection
// held (0: none), so no statement runs or waits for a lock past the
// caller's deadline.
func (s *connSet) setTimeouts(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ms := max(d.Milliseconds(), 0)
	if d > 0 {
		ms = max(ms, 1)
	}
	sql := fmt.Sprintf("SET lock_timeout = %d; SET statement_timeout = %d", ms, ms)
	for c := range s.conns {
		if _, err := c.Conn.Conn().Exec(ctx, sql); err != nil {
			return err
		}
	}
	return nil
}

// cancelStatements asks the server to cancel whatever each held connection
// is running, keeping the connections (a cancelled migration rolls back,
// and the version can then be put back on the same connection).
func (s *connSet) cancelStatements() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
		_ = c.Conn.Conn().PgConn().CancelRequest(ctx)
		cancel()
	}
}

// abort makes every connection held give up what it is waiting for: it asks
// the server to cancel the statement (a backend waiting for a lock does not
// notice a closed socket until the lock is granted) and closes the socket,
// so the caller returns at once. A connection asked for after it is
// refused: the context can end before golang-migrate has connected, and
// that connection would otherwise wait for the lock without bound.
func (s *connSet) abort() {
	s.mu.Lock()
	s.aborted = true
	s.mu.Unlock()
	s.cancelStatements()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		_ = c.Conn.Conn().PgConn().Conn().Close()
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
	c.set.mu.Lock()
	aborted := c.set.aborted
	c.set.mu.Unlock()
	if aborted {
		return nil, errAborted
	}
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	c.set.mu.Lock()
	defer c.set.mu.Unlock()
	if c.set.aborted { // abort ran while this one connected
		_ = dc.Close()
		return nil, errAborted
	}
	sc, ok := dc.(*stdlib.Conn)
	if !ok {
		_ = dc.Close()
		return nil, fmt.Errorf("pgmigrate: unexpected driver connection %T", dc)
	}
	oc := &ownedConn{Conn: sc, set: c.set}
	c.set.conns[oc] = struct{}{}
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

// Stepwise applies every pending up migration (up) or rolls every applied
// one back (down) as m.Up and m.Down do, but one Steps call per migration:
// golang-migrate reads the migrations after the one it runs ahead of it,
// each into a pipe its own goroutine writes, and a run that fails (a lock
// wait past the timeout) leaves those goroutines blocked for good. One
// step reads only the migration it runs. It returns migrate.ErrNoChange
// when nothing was pending, and stops, without error, once a step changed
// nothing (a GracefulStop: Run reports its context's end).
func Stepwise(m *migrate.Migrate, up bool) error {
	n := -1
	if up {
		n = 1
	}
	changed := false
	for {
		before, none, err := version(m)
		if err != nil {
			return err
		}
		if none && !up {
			return noChange(changed)
		}
		err = m.Steps(n)
		var short migrate.ErrShortLimit
		switch {
		case errors.As(err, &short), errors.Is(err, migrate.ErrNoChange), errors.Is(err, os.ErrNotExist):
			return noChange(changed)
		case err != nil:
			return err
		}
		after, afterNone, err := version(m)
		if err != nil {
			return err
		}
		if after == before && afterNone == none {
			return nil // stopped
		}
		changed = true
	}
}

// version is m's version, none true when no migration is applied.
func version(m *migrate.Migrate) (v uint, none bool, err error) {
	v, _, err = m.Version()
	if errors.Is(err, migrate.ErrNilVersion) {
		return 0, true, nil
	}
	return v, false, err
}

// noChange is migrate.ErrNoChange unless a step changed something.
func noChange(changed bool) error {
	if changed {
		return nil
	}
	return migrate.ErrNoChange
}
