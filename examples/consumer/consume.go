package main

import (
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fetchWait bounds each pull, so a worker sees a stop within about this
// long when no message comes.
const fetchWait = time.Second

// run fetches and settles deliveries on workers goroutines until stop is
// closed, then returns once every worker has finished the delivery it
// holds. Each worker pulls one message at a time, only when it is free:
// no message waits in a client buffer while its ack wait runs.
func (c *consumer) run(cons jetstream.Consumer, workers int, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() { c.work(cons, stop) })
	}
	wg.Wait()
}

// work is one worker's loop.
func (c *consumer) work(cons jetstream.Consumer, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(fetchWait))
		if err != nil {
			c.log.Warn("fetch failed", "error", err)
			select { // the connection reconnects on its own; do not spin meanwhile
			case <-stop:
				return
			case <-time.After(fetchWait):
			}
			continue
		}
		for msg := range batch.Messages() {
			select {
			case <-stop: // fetched as the consumer stops: let another take it now
				_ = msg.Nak()
				continue
			default:
			}
			c.handle(msg)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			c.log.Warn("fetch ended", "error", err)
		}
	}
}
