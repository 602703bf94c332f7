package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// order is a booked order, as the wire format gives it (settled item 32).
type order struct {
	ID             string `json:"id"`
	ClientOrderID  string `json:"client_order_id"`
	Symbol         string `json:"symbol"`
	Qty            string `json:"qty"`
	Side           string `json:"side"`
	Status         string `json:"status"`
	FilledQty      string `json:"filled_qty"`
	FilledAvgPrice string `json:"filled_avg_price"`
	CreatedAt      string `json:"created_at"`
	FilledAt       string `json:"filled_at"`
}

// errDuplicate is book.add's answer for a client_order_id already booked.
var errDuplicate = errors.New("client_order_id must be unique")

// book is the durable order book: one JSON line per order in a file, each
// written and fsynced before the order is answered, all read back at start.
type book struct {
	mu     sync.Mutex
	f      *os.File
	orders []order
	byCID  map[string]int // client_order_id -> index in orders
}

// openBook opens (or creates) the book's file and loads its orders. A last
// line cut short by a crash while it was written was never answered, so it
// is dropped and the file truncated behind the last whole order; any other
// line that does not parse stops the start.
func openBook(path string) (*book, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("order book: %w", err)
	}
	b := &book{f: f, byCID: map[string]int{}}
	good, err := b.load()
	if err == nil {
		err = f.Truncate(good)
	}
	if err == nil {
		_, err = f.Seek(good, 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("order book %s: %w", path, err)
	}
	return b, nil
}

// load reads every whole order line and returns the offset after the last.
func (b *book) load() (int64, error) {
	r := bufio.NewReader(b.f)
	var good int64
	for line := 1; ; line++ {
		text, err := r.ReadBytes('\n')
		if len(text) == 0 && err != nil {
			return good, nil
		}
		var o order
		if err != nil || json.Unmarshal(bytes.TrimSpace(text), &o) != nil || o.ClientOrderID == "" {
			if _, peekErr := r.Peek(1); err != nil || peekErr != nil {
				return good, nil // the torn last line of a crash
			}
			return 0, fmt.Errorf("line %d is not an order", line)
		}
		if _, dup := b.byCID[o.ClientOrderID]; dup {
			return 0, fmt.Errorf("line %d books client_order_id %q a second time", line, o.ClientOrderID)
		}
		b.byCID[o.ClientOrderID] = len(b.orders)
		b.orders = append(b.orders, o)
		good += int64(len(text))
	}
}

// add books o unless its client_order_id is booked already (errDuplicate).
// It returns once the order is on disk.
func (b *book) add(o order) error {
	line, err := json.Marshal(o)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, dup := b.byCID[o.ClientOrderID]; dup {
		return errDuplicate
	}
	end, err := b.f.Seek(0, io.SeekCurrent)
	if err == nil {
		_, err = b.f.Write(append(line, '\n'))
	}
	if err == nil {
		err = b.f.Sync()
	}
	if err != nil {
		// Cut a partial line off, so the next order starts a whole line.
		_ = b.f.Truncate(end)
		_, _ = b.f.Seek(end, io.SeekStart)
		return fmt.Errorf("order book: %w", err)
	}
	b.byCID[o.ClientOrderID] = len(b.orders)
	b.orders = append(b.orders, o)
	return nil
}

// find returns the order booked under a client_order_id.
func (b *book) find(clientOrderID string) (order, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i, ok := b.byCID[clientOrderID]
	if !ok {
		return order{}, false
	}
	return b.orders[i], true
}

// all returns every order, oldest first.
func (b *book) all() []order {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]order{}, b.orders...)
}

func (b *book) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.orders)
}

func (b *book) close() { b.f.Close() }
