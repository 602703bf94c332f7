package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// newPostgresStore is NewPostgresStore logging to log.
func newPostgresStore(pool *pgxpool.Pool, log *slog.Logger) *PostgresStore {
	if pool.Config().ConnConfig.ConnectTimeout <= 0 {
		log.WarnContext(context.Background(), "idempotency: the PostgreSQL pool has no ConnectTimeout: a connect into a black-holed network "+
			"hangs for two minutes and wedges the pool after the network heals; set connect_timeout (a few seconds) in the URL")
	}
	return &PostgresStore{pool: &pgPool{Pool: pool}}
}

// acquire takes a connection from the pool under ctx. The store acquires
// explicitly, then runs its statement on the connection, so it knows which
// step ran out of time: a wait for a connection that ran out is an
// *acquireError (pool_exhausted), logged with the pool's state.
func (s *PostgresStore) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	c, err := s.pool.Acquire(ctx)
	if err == nil {
		return c, nil
	}
	if ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
		return nil, err // refused, closed: the error says which
	}
	st := s.pool.Stat()
	inUse, opening, max := st.AcquiredConns(), st.ConstructingConns(), st.MaxConns()
	return nil, &acquireError{err: err, inUse: inUse, opening: opening, max: max}
}

// release gives c back to the pool. A connection pgx closed because a
// deadline interrupted its statement is still being torn down in the
// background (a cancel request, then a drain of up to 15 seconds, all of
// which a black-holed network takes), and the pool would count it in use
// until then, so that the next calls would read as saturation: it leaves
// the pool at once instead, and pgx closes its socket.
func release(c *pgxpool.Conn) {
	if c.Conn().IsClosed() {
		_ = c.Hijack()
		return
	}
	c.Release()
}

// withConn runs f on a connection acquired under ctx (conn), then
// releases it.
func (s *PostgresStore) withConn(ctx context.Context, f func(pgConn) error) error {
	c, err := s.conn(ctx)
	if err != nil {
		return err
	}
	defer c.release()
	return f(c)
}

// Probe implements Store with the pool's connection settings.
func (s *PostgresStore) Probe(ctx context.Context) error {
	return s.probes.Do(ctx, func(ctx context.Context) error {
		return postgresClasses.probeVerdict(s.probe(ctx))
	})
}

// probe connects as the pool does (BeforeConnect included) and runs
// SELECT 1. Through PgBouncer the statement reaches the database, and
// PgBouncer's own error for a server it cannot reach (class 08) is a
// failed probe.
func (s *PostgresStore) probe(ctx context.Context) error {
	cfg := s.pool.Config() // a copy
	if cfg.BeforeConnect != nil {
		if err := cfg.BeforeConnect(ctx, cfg.ConnConfig); err != nil {
			return err
		}
	}
	c, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return err
	}
	_, err = c.Exec(ctx, pgsql.ProbeSQL)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second) // the Terminate, not the verdict
	defer cancel()
	_ = c.Close(cctx)
	return err
}
