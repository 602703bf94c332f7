package readmetest_test

// Every package a snippet may import, so that go.mod requires it (go mod
// tidy keeps only what the module's own code imports). A snippet that needs
// another package fails until it is added here.
import (
	_ "connectrpc.com/connect"
	_ "github.com/getkin/kin-openapi/openapi3"
	_ "github.com/gin-gonic/gin"
	_ "github.com/go-chi/chi/v5"
	_ "github.com/go-chi/chi/v5/middleware"
	_ "github.com/gorilla/handlers"
	_ "github.com/gorilla/mux"
	_ "github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/labstack/echo/v4"
	_ "github.com/labstack/echo/v4/middleware"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	_ "go.opentelemetry.io/otel/metric"
	_ "google.golang.org/grpc"
	_ "google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/protobuf/types/known/structpb"

	_ "github.com/idemkit/idempotency"
	_ "github.com/idemkit/idempotency/contrib/chi"
	_ "github.com/idemkit/idempotency/contrib/connect"
	_ "github.com/idemkit/idempotency/contrib/echo"
	_ "github.com/idemkit/idempotency/contrib/gin"
	_ "github.com/idemkit/idempotency/contrib/gorilla"
	_ "github.com/idemkit/idempotency/contrib/grpc"
	_ "github.com/idemkit/idempotency/contrib/openapi"
	_ "github.com/idemkit/idempotency/contrib/otel"
	_ "github.com/idemkit/idempotency/idemclient"
	_ "github.com/idemkit/idempotency/idempotencytest"
	_ "github.com/idemkit/idempotency/migrations"
)
