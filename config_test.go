package idempotency

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore()
	if _, err := New(nil, Config{}); err == nil {
		t.Fatal("nil store accepted")
	}
	for _, cfg := range []Config{
		{Lease: time.Second, StoreTimeout: 2 * time.Second},
		{Lease: 2 * time.Second, StoreTimeout: 2 * time.Second},
		{Lease: -1},
		{StoreTimeout: -1},
	} {
		if _, err := New(store, cfg); err == nil {
			t.Fatalf("config %+v accepted", cfg)
		}
	}
	mw, err := New(store, Config{Lease: 45 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, rc := range []RouteConfig{
		{TTL: MaxTTL + time.Second},
		{TTL: 59 * time.Second},
		{TTL: 89 * time.Second}, // under twice the lease
		{MaxBodyBytes: -1},
		{MaxResponseBytes: -1},
		{Name: "orders\xff"},
		{Name: strings.Repeat("n", maxScopeBytes+1)},
		{ReplayHeaders: []string{"set-cookie"}},
		{ReplayHeaders: []string{"Proxy-Authorization"}},
		{ReplayHeaders: []string{"Date"}},
		{ReleaseOnError: true},
		{Transactional: true, FailOpen: true},
		{Transactional: true}, // a memory store cannot run transactions
	} {
		if _, err := mw.Route(rc); err == nil {
			t.Fatalf("route config %+v accepted", rc)
		}
	}
	if _, err := mw.Route(RouteConfig{TTL: 90 * time.Second}); err != nil {
		t.Fatalf("twice the lease refused: %v", err)
	}
	if _, err := mw.Route(RouteConfig{TTL: MaxTTL, ReplayHeaders: []string{"x-request-id"}}); err != nil {
		t.Fatalf("seven days refused: %v", err)
	}
	// The same registry twice is a construction error, not a panic.
	reg := prometheus.NewRegistry()
	if _, err := New(store, Config{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(store, Config{Registerer: reg}); err == nil {
		t.Fatal("double registration accepted")
	}
}
