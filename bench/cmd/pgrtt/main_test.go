package main

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
	"testing/iotest"
)

// frame is one server message: type, length, body.
func frame(typ byte, body string) []byte {
	b := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return append(b, body...)
}

// serverStream is a session's server side: authentication, a parameter, an
// idle ReadyForQuery; a query's rows (bodies full of 'Z' and 'I' bytes)
// ending in a transaction ('T'); a message with no body; a failed
// transaction ('E'); a COMMIT's idle ReadyForQuery. 4 round trips, 2 of
// them leaving the session idle.
func serverStream() []byte {
	var b bytes.Buffer
	for _, f := range [][]byte{
		frame('R', "\x00\x00\x00\x00"),
		frame('S', "client_encoding\x00UTF8\x00"),
		frame('Z', "I"),
		frame('1', ""),
		frame('T', "\x00\x01ZI\x00"),
		frame('D', "\x00\x01\x00\x00\x00\x02ZI"),
		frame('C', "SELECT 1\x00"),
		frame('Z', "T"),
		frame('n', ""),
		frame('Z', "E"),
		frame('C', "COMMIT\x00"),
		frame('Z', "I"),
	} {
		b.Write(f)
	}
	return b.Bytes()
}

// TestCounterFrames: ReadyForQuery messages and the idle ones are counted
// exactly, however the stream is cut into reads, and the bytes pass
// through unchanged.
func TestCounterFrames(t *testing.T) {
	stream := serverStream()
	for size := 1; size <= len(stream); size++ {
		roundTrips.Store(0)
		xacts.Store(0)
		c := &counter{r: iotest.OneByteReader(bytes.NewReader(stream))}
		var out bytes.Buffer
		if size > 1 {
			c.r = &chunked{data: stream, size: size}
		}
		if _, err := io.Copy(&out, c); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), stream) {
			t.Fatalf("reads of %d bytes: the stream changed on its way through", size)
		}
		if rt, x := roundTrips.Load(), xacts.Load(); rt != 4 || x != 2 {
			t.Fatalf("reads of %d bytes: %d round trips, %d transactions; want 4, 2", size, rt, x)
		}
	}
}

// chunked reads data size bytes at a time.
type chunked struct {
	data []byte
	size int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.size)], c.data)
	c.data = c.data[n:]
	return n, nil
}

// TestReadUntyped: a startup packet is read whole; a length out of bounds
// is refused.
func TestReadUntyped(t *testing.T) {
	pkt := make([]byte, 8)
	binary.BigEndian.PutUint32(pkt, 8)
	binary.BigEndian.PutUint32(pkt[4:], codeSSL)
	got, err := readUntyped(bytes.NewReader(append(pkt, 'x')))
	if err != nil || !bytes.Equal(got, pkt) {
		t.Errorf("readUntyped = %x, %v; want %x", got, err, pkt)
	}
	for _, n := range []uint32{0, 7, 10001} {
		bad := binary.BigEndian.AppendUint32(nil, n)
		if _, err := readUntyped(bytes.NewReader(append(bad, make([]byte, 16)...))); err == nil {
			t.Errorf("length %d accepted", n)
		}
	}
}
