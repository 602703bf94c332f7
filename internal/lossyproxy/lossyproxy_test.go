package lossyproxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFaults: each fault does what it says, as the client and the server
// see it.
func TestFaults(t *testing.T) {
	var served atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Seen", r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("X-In")+" "+string(body))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	}))
	defer upstream.Close()
	target, _ := url.Parse(upstream.URL)

	var fault atomic.Int32
	var lastStatus atomic.Int32
	p := &Proxy{Target: target, Delay: 50 * time.Millisecond,
		Plan:    func(int, *http.Request) Fault { return Fault(fault.Load()) },
		OnFault: func(_ int, _ *http.Request, _ Fault, status int) { lastStatus.Store(int32(status)) },
	}
	defer p.Close()
	ps := httptest.NewServer(p)
	defer ps.Close()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()

	for _, tc := range []struct {
		f          Fault
		wantServed int32
		wantErr    bool
	}{
		{Pass, 1, false},
		{DropRequest, 0, true},
		{DropAnswer, 1, true},
		{CutAnswer, 1, true},
		{Delay, 1, false},
	} {
		t.Run(tc.f.String(), func(t *testing.T) {
			fault.Store(int32(tc.f))
			before := served.Load()
			req, _ := http.NewRequest("POST", ps.URL+"/a/b?q=1", strings.NewReader("body"))
			req.Header.Set("X-In", "in")
			resp, err := client.Do(req)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err == nil {
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 201 || string(got) != "done" || resp.Header.Get("X-Seen") != "POST /a/b?q=1 in body" {
					t.Fatalf("answer %d %q %q", resp.StatusCode, got, resp.Header.Get("X-Seen"))
				}
			}
			if n := served.Load() - before; n != tc.wantServed {
				t.Fatalf("the server saw %d requests, want %d", n, tc.wantServed)
			}
			if want := 201 * tc.wantServed; lastStatus.Load() != want {
				t.Fatalf("OnFault status %d, want %d", lastStatus.Load(), want)
			}
		})
	}
}

// TestCutBody: the client gets the whole head, then half of the body and
// an unexpected EOF; the server answered once.
func TestCutBody(t *testing.T) {
	var served atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.Header().Set("X-Seen", "yes")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	}))
	defer upstream.Close()
	target, _ := url.Parse(upstream.URL)
	p := &Proxy{Target: target, Plan: func(int, *http.Request) Fault { return CutBody }}
	defer p.Close()
	ps := httptest.NewServer(p)
	defer ps.Close()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()

	resp, err := client.Post(ps.URL, "text/plain", strings.NewReader("body"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 201 || resp.ContentLength != 4 || resp.Header.Get("X-Seen") != "yes" || string(got) != "do" || err != io.ErrUnexpectedEOF {
		t.Fatalf("answer %d (length %d, X-Seen %q) %q, err %v; want 201 of 4 bytes cut after \"do\"",
			resp.StatusCode, resp.ContentLength, resp.Header.Get("X-Seen"), got, err)
	}
	if served.Load() != 1 {
		t.Fatalf("the server saw %d requests", served.Load())
	}
}
