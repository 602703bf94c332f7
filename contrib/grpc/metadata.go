package idemgrpc

// The handler's response metadata: held while it runs, sent only with its
// own answer (never ahead of a transactional commit, never beside an
// answer that replaces it), and stored only as the method allows.

import (
	"context"
	"net/http"
	"strings"
	"sync"

	"github.com/idemkit/idempotency/idemrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// captureStream is the handler's grpc.ServerTransportStream: it keeps the
// header and trailer metadata the handler sets until flush.
type captureStream struct {
	method string
	mu     sync.Mutex
	header metadata.MD
	trail  metadata.MD
}

func (c *captureStream) Method() string { return c.method }

func (c *captureStream) SetHeader(md metadata.MD) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.header = metadata.Join(c.header, md)
	return nil
}

// SendHeader keeps md like SetHeader: the header goes out with the answer.
func (c *captureStream) SendHeader(md metadata.MD) error { return c.SetHeader(md) }

func (c *captureStream) SetTrailer(md metadata.MD) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trail = metadata.Join(c.trail, md)
	return nil
}

// flush hands what the handler set to the call's own stream, with the
// key's expiry (ExpiresKey) unless it is "".
func (c *captureStream) flush(ctx context.Context, expires string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if expires != "" {
		if c.header == nil {
			c.header = metadata.MD{}
		}
		c.header.Set(ExpiresKey, expires)
	}
	if len(c.header) > 0 {
		_ = grpc.SetHeader(ctx, c.header)
	}
	if len(c.trail) > 0 {
		_ = grpc.SetTrailer(ctx, c.trail)
	}
}

// keep copies the allow-listed metadata into the stored headers.
func (c *captureStream) keep(h http.Header, allow []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range allow {
		if vs := c.header[k]; len(vs) > 0 {
			h[k] = append([]string(nil), vs...)
		}
		if vs := c.trail[k]; len(vs) > 0 {
			h[idemrpc.TrailerPrefix+k] = append([]string(nil), vs...)
		}
	}
}

// neverStored are metadata keys no allow-list may name: credentials, the
// transport's own, and HTTP's hop-by-hop and never-stored headers.
var neverStored = map[string]bool{
	"authorization": true, "cookie": true, "set-cookie": true, "www-authenticate": true,
	"connection": true, "keep-alive": true, "te": true, "trailer": true, "transfer-encoding": true,
	"upgrade": true, "date": true, "content-length": true, "content-type": true, "user-agent": true,
	MetadataKey: true, ReplayedKey: true, ExpiresKey: true,
}

// allowList validates a method's ReplayMetadata, lower-cased.
func allowList(keys []string) ([]string, error) {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		k = strings.ToLower(k)
		if k == "" || neverStored[k] || strings.HasPrefix(k, "grpc-") || strings.HasPrefix(k, "proxy-") ||
			strings.HasPrefix(k, ":") || strings.HasSuffix(k, "-bin") {
			return nil, errBadMetadata
		}
		out = append(out, k)
	}
	return out, nil
}
