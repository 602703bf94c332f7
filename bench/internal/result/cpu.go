package result

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is USER_HZ, the unit of /proc's CPU times: 100 on Linux.
const clockTick = 100

// CPUSample is where the machine's CPU time had gone at one instant.
type CPUSample struct {
	at      time.Time
	self    time.Duration // this process, user + system
	server  time.Duration // the -server-pid process
	busy    time.Duration // every core, all processes: not idle, not waiting for I/O
	total   time.Duration // every core, idle included
	partial bool          // something could not be read (not Linux, no such pid)
}

// SampleCPU reads the CPU time of this process, of serverPID (when
// positive) and of the whole machine.
func SampleCPU(serverPID int) CPUSample {
	s := CPUSample{at: time.Now()}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	} else {
		s.partial = true
	}
	if serverPID > 0 {
		if d, ok := procTime(serverPID); ok {
			s.server = d
		} else {
			s.partial = true
		}
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		s.partial = true
		return s
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		s.partial = true
		return s
	}
	var total, idle int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i >= 8 { // guest times are already inside user and nice
			break
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	s.total = ticks(total)
	s.busy = ticks(total - idle)
	return s
}

// procTime is a process's user + system CPU time from /proc/PID/stat.
func procTime(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name may hold spaces: fields count from its closing ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return ticks(u + st), true
}

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / clockTick }

// FillCPU sets the CPU fields of s, per measured request, from samples
// taken at both ends of the measured window; withServer says whether the
// samples hold a server process.
func FillCPU(s *Summary, c0, c1 CPUSample, withServer bool) {
	if c0.partial || c1.partial || c1.total <= c0.total || s.Requests == 0 {
		return
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(s.Requests) }
	busy := c1.busy - c0.busy
	s.MachineBusyPct = 100 * float64(busy) / float64(c1.total-c0.total)
	s.CPULoadgenUs = per(c1.self - c0.self)
	other := busy - (c1.self - c0.self)
	if withServer {
		s.CPUServerUs = per(c1.server - c0.server)
		other -= c1.server - c0.server
	}
	s.CPUOtherUs = per(max(other, 0))
}

// BackgroundBusy samples how busy the machine's cores are over d, in
// percent; 0 when /proc cannot be read.
func BackgroundBusy(d time.Duration) float64 {
	c0 := SampleCPU(0)
	time.Sleep(d)
	c1 := SampleCPU(0)
	if c0.partial || c1.partial || c1.total <= c0.total {
		return 0
	}
	return 100 * float64(c1.busy-c0.busy) / float64(c1.total-c0.total)
}

// Settle waits, at most maxWait, for the machine's cores to be less than
// belowPct busy, sampling every half second, so a run starts on a machine
// that other work has left alone where it can. It returns the last sample.
func Settle(maxWait time.Duration, belowPct float64) float64 {
	deadline := time.Now().Add(maxWait)
	for {
		busy := BackgroundBusy(500 * time.Millisecond)
		if busy < belowPct || !time.Now().Before(deadline) {
			return busy
		}
	}
}

// ProcsCPU reads the user + system CPU time of each of pids from /proc;
// a pid that cannot be read (it has exited) is left out.
func ProcsCPU(pids []int) map[int]time.Duration {
	m := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		if d, ok := procTime(pid); ok {
			m[pid] = d
		}
	}
	return m
}

// ProcsDelta is the CPU time a set of processes spent between two
// readings: for a process read both times, the difference; for one that
// appeared only at the end (started inside the window, such as a
// database backend a pool opened), all of its time. A process gone by the
// end is lost to the sum, and counted in lost.
func ProcsDelta(before, after map[int]time.Duration) (d time.Duration, lost int) {
	for pid, t1 := range after {
		d += t1 - before[pid]
	}
	for pid := range before {
		if _, ok := after[pid]; !ok {
			lost++
		}
	}
	return d, lost
}
