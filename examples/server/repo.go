package main

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"
)

// order is a paper order as the API shows it.
type order struct {
	ID            int64     `json:"id"`
	UserID        int64     `json:"-"`
	Symbol        string    `json:"symbol"`
	Side          string    `json:"side"`
	Qty           int64     `json:"qty"`
	Status        string    `json:"status"`
	FillPrice     float64   `json:"fill_price"`
	ClientOrderID string    `json:"client_order_id,omitempty"` // the Idempotency-Key, when there was one
	CreatedAt     time.Time `json:"created_at"`
}

// auditEntry is one audit_log row.
type auditEntry struct {
	ID        int64
	UserID    int64
	Action    string
	Context   json.RawMessage
	CreatedAt time.Time
}

// repo holds the example's own data: demo users, paper orders and the
// audit log. memoryRepo and pgRepo implement it.
type repo interface {
	createUser(ctx context.Context, name string) (int64, error)
	// placeOrder stores o (assigning ID and CreatedAt) together with its
	// order_placed audit row: both or neither.
	placeOrder(ctx context.Context, o order) (order, error)
	// orders returns the user's orders, oldest first.
	orders(ctx context.Context, userID int64) ([]order, error)
	// order returns one of the user's orders, or errNotFound.
	order(ctx context.Context, userID, id int64) (order, error)
	// orderByClientID returns the user's committed order with that
	// client_order_id (live mode: the venue's), or errNotFound.
	orderByClientID(ctx context.Context, userID int64, clientOrderID string) (order, error)
	// audit appends an audit_log row; userID 0 stores NULL.
	audit(ctx context.Context, userID int64, action string, details any) error
	// auditLog returns the user's audit rows, oldest first.
	auditLog(ctx context.Context, userID int64) ([]auditEntry, error)
}

// memoryRepo is the repo of the in-memory mode.
type memoryRepo struct {
	mu        sync.Mutex
	lastUser  int64
	users     map[int64]string
	lastOrder int64
	orderList []order
	lastAudit int64
	auditRows []auditEntry
}

func newMemoryRepo() *memoryRepo { return &memoryRepo{users: map[int64]string{}} }

func (m *memoryRepo) createUser(_ context.Context, name string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastUser++
	m.users[m.lastUser] = name
	return m.lastUser, nil
}

func (m *memoryRepo) placeOrder(_ context.Context, o order) (order, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now().UTC().Truncate(time.Microsecond)
	o.ID, o.CreatedAt = m.lastOrder+1, now
	ctxJSON, err := json.Marshal(orderPlacedContext(o))
	if err != nil {
		return order{}, err
	}
	m.lastOrder++
	m.orderList = append(m.orderList, o)
	m.appendAudit(o.UserID, "order_placed", ctxJSON, now)
	return o, nil
}

func (m *memoryRepo) orders(_ context.Context, userID int64) ([]order, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []order{}
	for _, o := range m.orderList {
		if o.UserID == userID {
			out = append(out, o)
		}
	}
	return out, nil
}

func (m *memoryRepo) order(_ context.Context, userID, id int64) (order, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := slices.IndexFunc(m.orderList, func(o order) bool { return o.ID == id && o.UserID == userID })
	if i < 0 {
		return order{}, errNotFound
	}
	return m.orderList[i], nil
}

func (m *memoryRepo) orderByClientID(_ context.Context, userID int64, clientOrderID string) (order, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := slices.IndexFunc(m.orderList, func(o order) bool { return o.ClientOrderID == clientOrderID && o.UserID == userID })
	if i < 0 {
		return order{}, errNotFound
	}
	return m.orderList[i], nil
}

func (m *memoryRepo) audit(_ context.Context, userID int64, action string, details any) error {
	ctxJSON, err := json.Marshal(details)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.appendAudit(userID, action, ctxJSON, time.Now().UTC().Truncate(time.Microsecond))
	return nil
}

func (m *memoryRepo) appendAudit(userID int64, action string, ctxJSON []byte, at time.Time) {
	m.lastAudit++
	m.auditRows = append(m.auditRows, auditEntry{ID: m.lastAudit, UserID: userID, Action: action, Context: ctxJSON, CreatedAt: at})
}

func (m *memoryRepo) auditLog(_ context.Context, userID int64) ([]auditEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []auditEntry
	for _, e := range m.auditRows {
		if e.UserID == userID {
			out = append(out, e)
		}
	}
	return out, nil
}

// orderPlacedContext is the context of an order's order_placed audit row.
func orderPlacedContext(o order) map[string]any {
	return map[string]any{"order_id": o.ID, "symbol": o.Symbol, "side": o.Side, "qty": o.Qty}
}
