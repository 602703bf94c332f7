package exampledoc

import (
	"net/http"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run on a goroutine left behind (the example server's
// log reader included), once the idle keep-alive connections of the tests'
// client are closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(closingIdle{m}) }

// closingIdle runs the tests, then closes http.DefaultClient's idle
// connections, whose goroutines are not leaks.
type closingIdle struct{ m *testing.M }

func (c closingIdle) Run() int {
	code := c.m.Run()
	http.DefaultClient.CloseIdleConnections()
	return code
}
