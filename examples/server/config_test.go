package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

func getenvOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want config
	}{
		{name: "defaults", want: config{addr: "127.0.0.1:8080", lease: 30 * time.Second, storeTimeout: 2 * time.Second}},
		{
			name: "environment",
			env: map[string]string{"ADDR": "0.0.0.0:9000", "DATABASE_URL": "postgres://u@db.invalid/app", "ORDER_LATENCY": "300ms",
				"IDEMPOTENCY_LEASE": "1m", "IDEMPOTENCY_STORE_TIMEOUT": "5s", "MIGRATE_DATABASE_URL": "postgres://owner@db.invalid/app"},
			want: config{addr: "0.0.0.0:9000", databaseURL: "postgres://u@db.invalid/app", migrateURL: "postgres://owner@db.invalid/app", orderLatency: 300 * time.Millisecond,
				lease: time.Minute, storeTimeout: 5 * time.Second},
		},
		{
			name: "flags win over environment, even over a bad value",
			args: []string{"-addr", "127.0.0.1:1", "-database-url", "", "-order-latency", "1s", "-lease=45s", "--store-timeout", "3s"},
			env: map[string]string{"ADDR": "0.0.0.0:9000", "DATABASE_URL": "postgres://u@db.invalid/app", "ORDER_LATENCY": "bogus",
				"IDEMPOTENCY_LEASE": "1m", "IDEMPOTENCY_STORE_TIMEOUT": "5s"},
			want: config{addr: "127.0.0.1:1", orderLatency: time.Second, lease: 45 * time.Second, storeTimeout: 3 * time.Second},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseConfig(tc.args, getenvOf(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if got.addr != tc.want.addr || got.databaseURL != tc.want.databaseURL || got.migrateURL != tc.want.migrateURL || got.orderLatency != tc.want.orderLatency ||
				got.lease != tc.want.lease || got.storeTimeout != tc.want.storeTimeout {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if got.dbWait != dbStartupWait || !got.devSecret || string(got.sessionSecret) != devSessionSecret {
				t.Fatalf("dbWait %v, devSecret %v", got.dbWait, got.devSecret)
			}
		})
	}

	cfg, err := parseConfig(nil, getenvOf(map[string]string{"SESSION_SECRET": "s3cret"}))
	if err != nil || cfg.devSecret || string(cfg.sessionSecret) != "s3cret" {
		t.Fatalf("SESSION_SECRET: %+v, %v", cfg, err)
	}
	if _, err := parseConfig([]string{"-h"}, getenvOf(nil)); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
}

func TestParseConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string // in the message
	}{
		{args: []string{"-lease", "30"}, want: "-lease"},
		{args: []string{"-order-latency", "soon"}, want: "Go duration"},
		{args: []string{"-nope"}, want: "-nope"},
		{args: []string{"extra"}, want: "unexpected argument"},
		{env: map[string]string{"ORDER_LATENCY": "5 seconds"}, want: "ORDER_LATENCY"},
		{env: map[string]string{"IDEMPOTENCY_LEASE": "abc"}, want: "IDEMPOTENCY_LEASE"},
		{args: []string{"-order-latency", "-1s"}, want: "must not be negative"},
		{args: []string{"-lease", "0s"}, want: "must be positive"},
		{args: []string{"-store-timeout", "0"}, want: "-store-timeout"},
		{args: []string{"-lease", "2s", "-store-timeout", "2s"}, want: "must exceed"},
		{args: []string{"-lease", "13h"}, want: "at most 12h"},
		{args: []string{"-addr", "localhost"}, want: "host:port"},
		{args: []string{"-database-url", "postgres://u:hunter2@db.invalid:notaport/app"}, want: "-database-url"},
		{args: []string{"-migrate-database-url", "postgres://u@db.invalid/app"}, want: "needs -database-url"},
		{args: []string{"-database-url", "postgres://u@db.invalid/app", "-migrate-database-url", "postgres://u:hunter2@db.invalid:notaport/app"}, want: "-migrate-database-url"},
		{env: map[string]string{"DATABASE_URL": "postgres://u@db.invalid/app", "MIGRATE_DATABASE_URL": "postgres://u:hunter2@db.invalid:x/app"}, want: "MIGRATE_DATABASE_URL"},
	} {
		_, err := parseConfig(tc.args, getenvOf(tc.env))
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: got %v, want a usage error mentioning %q", tc.args, tc.env, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
}

func TestExitCode(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if got := exitCode(nil, &out); got != 0 || out.Len() != 0 {
		t.Fatalf("nil: %d %q", got, out.String())
	}
	if got := exitCode(usagef("bad flag"), &out); got != 2 || !strings.Contains(out.String(), "bad flag") {
		t.Fatalf("usage: %d %q", got, out.String())
	}
	out.Reset()
	if got := exitCode(errors.New("database unreachable"), &out); got != 1 || !strings.Contains(out.String(), "database unreachable") {
		t.Fatalf("runtime: %d %q", got, out.String())
	}
}

func TestRunUsage(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-lease", "forever"}, getenvOf(nil), &stdout, &stderr)
	var ue *usageError
	if !errors.As(err, &ue) {
		t.Fatalf("bad flag: %v", err)
	}
	if err := run(context.Background(), []string{"-h"}, getenvOf(nil), &stdout, &stderr); err != nil {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"-order-latency", "IDEMPOTENCY_LEASE", "FLAG_IDEMPOTENCY_MIDDLEWARE", "MBT_NEW_ORDERS_DISABLED", "SESSION_SECRET"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("usage lacks %s:\n%s", want, stdout.String())
		}
	}
}

func TestSwitches(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{"": false, "0": false, "no": false, "1": true, "true": true, " YES ": true, "on": true} {
		if got := truthy(v); got != want {
			t.Errorf("truthy(%q) = %v", v, got)
		}
	}
}

func TestSessions(t *testing.T) {
	t.Parallel()
	s := sessions{secret: []byte("k")}
	tok := s.token(42)
	if uid, ok := s.verify(tok); !ok || uid != 42 {
		t.Fatalf("verify(%q) = %d, %v", tok, uid, ok)
	}
	_, sig, _ := strings.Cut(tok, ".")
	for _, bad := range []string{"", "42", "42.", tok + "A", "43." + sig, "042." + sig, "-42." + sig, "0." + sig,
		sessions{secret: []byte("other")}.token(42)} {
		if _, ok := s.verify(bad); ok {
			t.Errorf("verify(%q) accepted", bad)
		}
	}
}

// TestParseConfigVenue: -venue-url / VENUE_URL switch on the live mode,
// with its secrets from the environment only; a URL that is not http(s) is
// a usage error; paper mode reads none of them.
func TestParseConfigVenue(t *testing.T) {
	t.Parallel()
	env := map[string]string{"VENUE_URL": "http://127.0.0.1:8090", "VENUE_KEY_ID": "kid", "VENUE_SECRET_KEY": "sk",
		"IDEMPOTENCY_DERIVE_KEYS": " d2:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=,d1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE= "}
	cfg, err := parseConfig(nil, getenvOf(env))
	if err != nil || cfg.venueURL != "http://127.0.0.1:8090" || cfg.venueKeyID != "kid" || cfg.venueSecret != "sk" ||
		cfg.deriveKeys == nil || cfg.deriveKeys.IDs()[0] != "d2" {
		t.Fatalf("environment: %+v, %v", cfg, err)
	}
	var ue *usageError
	if _, err := parseConfig(nil, getenvOf(map[string]string{"VENUE_URL": "http://v", "IDEMPOTENCY_DERIVE_KEYS": "d1:c2VjcmV0"})); !errors.As(err, &ue) ||
		!strings.Contains(err.Error(), "IDEMPOTENCY_DERIVE_KEYS") || strings.Contains(err.Error(), "c2VjcmV0") {
		t.Fatalf("a malformed derive key: %v, want a usage error naming the variable, never the key", err)
	}
	if cfg, err = parseConfig([]string{"-venue-url", "https://paper-api.example"}, getenvOf(env)); err != nil || cfg.venueURL != "https://paper-api.example" {
		t.Fatalf("the flag wins: %q, %v", cfg.venueURL, err)
	}
	if cfg, err = parseConfig(nil, getenvOf(map[string]string{"VENUE_KEY_ID": "kid", "IDEMPOTENCY_DERIVE_KEYS": "dk"})); err != nil || cfg.venueURL != "" || cfg.venueKeyID != "" || cfg.deriveKeys != nil {
		t.Fatalf("paper mode: %+v, %v", cfg, err)
	}
	for _, bad := range []string{"127.0.0.1:8090", "ftp://venue", "http://"} {
		if _, err := parseConfig([]string{"-venue-url", bad}, getenvOf(nil)); !errors.As(err, &ue) || !strings.Contains(err.Error(), "-venue-url") {
			t.Errorf("-venue-url %q: %v, want a usage error naming the flag", bad, err)
		}
	}
}
