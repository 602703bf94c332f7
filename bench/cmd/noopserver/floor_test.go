package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/bench/internal/gosrc"
	"github.com/idemkit/idempotency/internal/testdb"
)

// TestFloorSQLIsTheStore's: the floor runs the statements it reads out of
// internal/pgsql, and refuses a file without them.
func TestFloorSQLIsTheStore(t *testing.T) {
	consts, err := gosrc.StringConsts(storeSQL)
	if err != nil {
		t.Fatal(err)
	}
	q, err := loadFloorSQL(storeSQL)
	if err != nil {
		t.Fatal(err)
	}
	if q.claim != consts["pgClaimSQL"] || q.complete != consts["pgCompleteSQL"] || q.claim == "" || q.complete == "" {
		t.Fatalf("the floor's statements are not internal/pgsql's: %+v", q)
	}
	if _, err := loadFloorSQL("floor.go"); err == nil {
		t.Fatal("a file without the statements was accepted")
	}
}

// storeSQL is the root package's file of statements, from this directory.
const storeSQL = "../../../internal/pgsql/pgsql.go"

// exchange is one request's answer and the statements it ran.
type exchange struct {
	status   int
	replayed bool
	ctype    string
	body     string
	queries  []pgx.TraceQueryStartData
}

// TestFloorRunsNsStatements: the floor (N0) runs what N runs, with
// arguments of the same types and, but for the key, owner token, row and
// request hash, the same values: for a new key the claim then the
// complete, answering N's 201; for the same key again the claim alone,
// answering the stored response as a replay.
func TestFloorRunsNsStatements(t *testing.T) {
	rec := &recorder{}
	pool := testdb.New(t, testdb.Tracer(rec), testdb.MaxConns(2))
	ctx := context.Background()
	nh, err := newHandler(ctx, pool, slog.New(slog.DiscardHandler), nil, keepSlots)
	if err != nil {
		t.Fatal(err)
	}
	fh, err := newFloorHandler(ctx, pool, storeSQL)
	if err != nil {
		t.Fatal(err)
	}
	post := func(h http.Handler, key string) exchange {
		t.Helper()
		srv := httptest.NewServer(h)
		defer srv.Close()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/noop", strings.NewReader(`{"n":1}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		rec.start()
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return exchange{resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true",
			resp.Header.Get("Content-Type"), string(b), rec.take()}
	}
	nKey, fKey := uuid.NewString(), uuid.NewString()
	nMiss, fMiss := post(nh, nKey), post(fh, fKey)
	if fMiss.status != http.StatusCreated || fMiss.replayed || fMiss.body != answerBody || fMiss.ctype != "application/json" {
		t.Fatalf("floor, new key: %+v, want N's fresh 201 %s", fMiss, answerBody)
	}
	sameStatements(t, "new key", nMiss.queries, fMiss.queries)
	if len(fMiss.queries) == 2 {
		if claim := fMiss.queries[0].Args; claim[0] != fKey || claim[3] != floorHash {
			t.Errorf("floor's claim arguments %v: want key %s, hash %s", claim, fKey, floorHash)
		}
	}

	nHot, fHot := post(nh, nKey), post(fh, fKey)
	if !nHot.replayed {
		t.Fatalf("N, same key again: %+v, want a replay", nHot)
	}
	// The stored body byte for byte; the middleware would add its replay
	// marker to it.
	if fHot.status != http.StatusCreated || !fHot.replayed || fHot.body != answerBody || fHot.ctype != "application/json" {
		t.Fatalf("floor, same key again: %+v, want the stored 201 %s, replayed, byte for byte", fHot, answerBody)
	}
	sameStatements(t, "replay", nHot.queries, fHot.queries)
}

// qualifiedName is the table's name as the store sends it
// (store_pg_pool.go).
var qualifiedName = regexp.MustCompile(`[\w"]+\.idempotency_keys\b`)

// unqualified is sql naming the table as internal/pgsql writes it.
func unqualified(sql string) string { return qualifiedName.ReplaceAllString(sql, "idempotency_keys") }

// sameStatements fails unless got runs want's statements, with arguments
// of the same types, equal but for the claim's key, hash and owner token
// and the complete's row id.
func sameStatements(t *testing.T, what string, want, got []pgx.TraceQueryStartData) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: the floor ran %d statements, N %d", what, len(got), len(want))
	}
	for i := range want {
		if got[i].SQL != want[i].SQL {
			t.Errorf("%s: statement %d differs:\n%s\n--- N ran ---\n%s", what, i, got[i].SQL, want[i].SQL)
			continue
		}
		differ := map[int]bool{}
		sql := unqualified(got[i].SQL)
		if q, _ := loadFloorSQL(storeSQL); sql == q.claim {
			differ = map[int]bool{0: true, 3: true, 6: true}
		} else if sql == q.complete {
			differ = map[int]bool{0: true, 8: true} // the id and the key
		}
		if len(got[i].Args) != len(want[i].Args) {
			t.Errorf("%s: statement %d: %d arguments, N sent %d", what, i, len(got[i].Args), len(want[i].Args))
			continue
		}
		for j, w := range want[i].Args {
			g := got[i].Args[j]
			if reflect.TypeOf(g) != reflect.TypeOf(w) {
				t.Errorf("%s: statement %d, argument %d: %T, N sent %T", what, i, j+1, g, w)
			} else if !differ[j] && fmt.Sprint(g) != fmt.Sprint(w) {
				t.Errorf("%s: statement %d, argument %d: %v, N sent %v", what, i, j+1, g, w)
			}
		}
	}
}

// TestFloorWithoutKey: a request without a key is refused before any
// statement.
func TestFloorWithoutKey(t *testing.T) {
	w := httptest.NewRecorder()
	floor{}.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/noop", strings.NewReader(`{}`)))
	if w.Code != http.StatusBadRequest {
		t.Errorf("no key: %d, want 400", w.Code)
	}
}
