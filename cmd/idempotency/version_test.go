package main

import (
	"encoding/json"
	"fmt"
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersion is not parallel: it replaces readBuildInfo.
func TestVersion(t *testing.T) {
	r := runCLI(t, nil, "version")
	wantCode(t, r, exitOK)
	if !strings.HasPrefix(r.stdout, "idempotency ") || !strings.Contains(r.stdout, "go1.") {
		t.Fatalf("version of the test binary: %q", r.stdout)
	}

	defer func(f func() (*debug.BuildInfo, bool)) { readBuildInfo = f }(readBuildInfo)
	readBuildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/idemkit/idempotency", Version: "v1.4.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0cdef35"}, {Key: "vcs.modified", Value: "true"}}}, true
	}
	r = runCLI(t, nil, "version")
	wantCode(t, r, exitOK)
	if want := "idempotency v1.4.0 (module github.com/idemkit/idempotency, go1.26.8, revision 0cdef35 modified)\n"; r.stdout != want {
		t.Fatalf("version: %q, want %q", r.stdout, want)
	}
	r = runCLI(t, nil, "version", "--json")
	wantCode(t, r, exitOK)
	var v versionInfo
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Version != "v1.4.0" || v.Module != "github.com/idemkit/idempotency" || v.Revision != "0cdef35" || v.Modified == nil || !*v.Modified {
		t.Fatalf("version --json: %+v, %v\n%s", v, err, r.stdout)
	}
	readBuildInfo = func() (*debug.BuildInfo, bool) { return nil, false }
	wantCode(t, runCLI(t, nil, "version"), exitFailure)
}

// TestVersionJSONModified: --json carries "modified" whenever the build
// recorded the checkout's state, false included (a clean checkout), and
// leaves it out only when there was none; a checkout build's pseudo-version
// is printed as the build recorded it.
func TestVersionJSONModified(t *testing.T) {
	defer func(f func() (*debug.BuildInfo, bool)) { readBuildInfo = f }(readBuildInfo)
	for _, c := range []struct {
		version  string
		settings []debug.BuildSetting
		want     string // the modified member, or "" for none
	}{
		{"v0.0.0-20261201221123-7d94a53a1745", []debug.BuildSetting{{Key: "vcs.revision", Value: "7d94a53a1745"}, {Key: "vcs.modified", Value: "false"}}, "false"},
		{"v0.0.0-20261201221123-7d94a53a1745+dirty", []debug.BuildSetting{{Key: "vcs.revision", Value: "7d94a53a1745"}, {Key: "vcs.modified", Value: "true"}}, "true"},
		{"(devel)", nil, ""},
	} {
		readBuildInfo = func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/idemkit/idempotency", Version: c.version}, Settings: c.settings}, true
		}
		r := runCLI(t, nil, "version", "--json")
		wantCode(t, r, exitOK)
		var v map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Fatal(err)
		}
		if v["version"] != c.version {
			t.Errorf("%s: version %v", c.version, v["version"])
		}
		got, ok := v["modified"]
		switch {
		case c.want == "" && ok:
			t.Errorf("%s: modified %v, want none (no VCS state recorded)", c.version, got)
		case c.want != "" && (!ok || fmt.Sprint(got) != c.want):
			t.Errorf("%s: modified %v (present %v), want %s:\n%s", c.version, got, ok, c.want, r.stdout)
		}
	}
}
