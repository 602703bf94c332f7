-- name: CreateOrder :one
INSERT INTO orders (symbol) VALUES ($1) RETURNING id;

-- name: CountOrders :one
SELECT COUNT(*) FROM orders WHERE symbol = $1;
