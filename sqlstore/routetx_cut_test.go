package sqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/tcpproxy"
	"github.com/idemkit/idempotency/internal/testdb"
	"github.com/idemkit/idempotency/sqlstore"
)

// cutStoreTimeout is the store timeout of the link-cut tests; cutBound is
// their "never hangs" bound, far above every deadline the route has (the
// store timeout per call, two seconds for the transaction's state).
const (
	cutStoreTimeout = 300 * time.Millisecond
	cutBound        = 20 * time.Second
)

// cutStore is a Store whose connections go through a proxy.
type cutStore struct {
	name  string
	s     *sqlstore.Store
	proxy *tcpproxy.Proxy
}

// cutStores are a store on each driver, through a proxy of its own.
func cutStores(t *testing.T) []cutStore {
	t.Helper()
	var out []cutStore
	for _, driver := range pgDrivers {
		dsn := testdb.NewDSN(t)
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		p := tcpproxy.New(t, u.Host)
		u.Host = p.Addr()
		db, err := sql.Open(driver, u.String())
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(2)
		t.Cleanup(func() { _ = db.Close() })
		out = append(out, cutStore{name: driver, s: pgStore(t, db), proxy: p})
	}
	d := newMySQLDB(t)
	p := tcpproxy.New(t, mysqlAddr(t, d.dsn))
	cfg, _ := mysql.ParseDSN(d.dsn)
	cfg.Addr, cfg.Timeout = p.Addr(), time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlstore.New(t.Context(), db, sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		t.Fatal(err)
	}
	return append(out, cutStore{name: "mysql", s: s, proxy: p})
}

// within runs f and fails t by name when it has not returned within
// cutBound; the proxy is closed then, so that f's connections fail and f
// ends before the test does.
func within(t *testing.T, p *tcpproxy.Proxy, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(cutBound):
		p.Close()
		<-done
		t.Fatalf("%s: no answer within %v: a call past its deadline hung", what, cutBound)
	}
}

// TestTxRouteLinkCutAtCommit: the link black-holed after the handler ran,
// so that the record and COMMIT get no reply: the client gets 503 within
// the bound, on pgx's stdlib, lib/pq and MariaDB (issue 33, DESIGN-settled-r4
// item 6: every call that ends a transaction has the store timeout as its
// deadline; on lib/pq the connection is freed only when its socket fails,
// so there the answer's deadline alone is asserted).
func TestTxRouteLinkCutAtCommit(t *testing.T) {
	t.Parallel()
	for _, c := range cutStores(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			mw, err := idempotency.New(c.s, idempotency.Config{StoreTimeout: cutStoreTimeout})
			if err != nil {
				t.Fatal(err)
			}
			route, err := mw.Route(idempotency.RouteConfig{Transactional: true})
			if err != nil {
				t.Fatal(err)
			}
			h := route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c.proxy.Blackhole()
				w.WriteHeader(http.StatusCreated)
			}))
			var code int
			within(t, c.proxy, "black-holed at the commit", func() { code, _, _ = post(t, h, uuid.NewString(), "x") })
			if code != http.StatusServiceUnavailable {
				t.Fatalf("black-holed at the commit: %d, want 503", code)
			}
			c.proxy.Restore()
			if code, body, _ := post(t, h, uuid.NewString(), "x"); code != http.StatusServiceUnavailable {
				// The handler black-holes again: the route still answers.
				t.Fatalf("second order: %d %s, want 503", code, body)
			}
			c.proxy.Restore()
		})
	}
}

// TestTxCommitLinkCutStoreAPI: through the store's API, the link
// black-holed right before Commit: Commit returns within a bound of its
// deadline with a store error, the transaction reports TxClosed, and Abort
// returns at once (nothing waits on the dead link).
func TestTxCommitLinkCutStoreAPI(t *testing.T) {
	t.Parallel()
	for _, c := range cutStores(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var b [8]byte
			_, _ = rand.Read(b[:])
			req := idempotency.ClaimRequest{Key: uuid.NewString(), Endpoint: "POST /orders", RequestHash: hex.EncodeToString(b[:]) + hex.EncodeToString(b[:]) + hex.EncodeToString(b[:]) + hex.EncodeToString(b[:]),
				TTL: time.Hour, Lease: 30 * time.Second}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rt, res, err := c.s.BeginClaim(ctx, &req)
			if err != nil || !res.Won {
				t.Fatalf("BeginClaim: %v %+v", err, res)
			}
			_, end := rt.Lend(ctx)
			end()
			if st := rt.State(); st != idempotency.TxOpen {
				t.Fatalf("State before the cut: %v, want TxOpen", st)
			}
			c.proxy.Blackhole()
			within(t, c.proxy, "Commit", func() {
				cctx, ccancel := context.WithTimeout(context.Background(), cutStoreTimeout)
				defer ccancel()
				start := time.Now()
				err = rt.Commit(cctx, &idempotency.Settlement{Fence: res.Record.Fence(), Response: idempotency.Response{Status: 201, BodyKind: idempotency.BodyNone}})
				var se *idempotency.StoreError
				if !errors.As(err, &se) {
					t.Errorf("Commit on a black-holed link: %v, want a store error", err)
				}
				if took := time.Since(start); took > 5*cutStoreTimeout {
					t.Errorf("Commit on a black-holed link returned after %v, want about its deadline %v", took, cutStoreTimeout)
				}
				if st := rt.State(); st != idempotency.TxClosed {
					t.Errorf("State after the lost Commit: %v, want TxClosed", st)
				}
				actx, acancel := context.WithTimeout(context.Background(), cutStoreTimeout)
				defer acancel()
				_ = rt.Abort(actx)
			})
			c.proxy.Restore()
		})
	}
}

// TestOrdinaryRouteLinkCut: an ordinary fail-closed route answers within
// the bound on every driver when the link is black-holed before the
// claim (503) and while the handler runs (the record gets no reply; the
// engine tries to settle for up to the lease, 3s here): no store call
// waits past its deadline, lib/pq's included.
func TestOrdinaryRouteLinkCut(t *testing.T) {
	t.Parallel()
	for _, c := range cutStores(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			mw, err := idempotency.New(c.s, idempotency.Config{StoreTimeout: cutStoreTimeout, Lease: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			route, err := mw.Route(idempotency.RouteConfig{})
			if err != nil {
				t.Fatal(err)
			}
			cutInHandler := false
			h := route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if cutInHandler {
					c.proxy.Blackhole()
				}
				w.WriteHeader(http.StatusCreated)
			}))
			c.proxy.Blackhole()
			var code int
			within(t, c.proxy, "black-holed before the claim", func() { code, _, _ = post(t, h, uuid.NewString(), "x") })
			if code != http.StatusServiceUnavailable {
				t.Fatalf("black-holed before the claim: %d, want 503", code)
			}
			c.proxy.Restore()
			cutInHandler = true
			within(t, c.proxy, "black-holed mid-handler", func() { code, _, _ = post(t, h, uuid.NewString(), "x") })
			c.proxy.Restore()
		})
	}
}
