package result

import (
	"os"
	"testing"
	"time"
)

// TestProcsDelta: a process read at both ends counts its difference, one
// that appeared by the end counts whole, one gone by the end is lost.
func TestProcsDelta(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	before := map[int]time.Duration{1: ms(10), 2: ms(20), 3: ms(5)}
	after := map[int]time.Duration{1: ms(15), 2: ms(20), 4: ms(7)}
	d, lost := ProcsDelta(before, after)
	if d != ms(12) || lost != 1 {
		t.Errorf("ProcsDelta = %v, %d lost; want 12ms, 1 lost", d, lost)
	}
}

// TestProcsCPU reads this process and leaves out a pid that does not
// exist.
func TestProcsCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	m := ProcsCPU([]int{os.Getpid(), 1 << 30})
	if _, ok := m[os.Getpid()]; !ok || len(m) != 1 {
		t.Errorf("ProcsCPU = %v; want this process only", m)
	}
}
