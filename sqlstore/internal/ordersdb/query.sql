-- name: CreateOrder :execlastid
INSERT INTO orders (symbol) VALUES (?);

-- name: CountOrders :one
SELECT COUNT(*) FROM orders WHERE symbol = ?;
