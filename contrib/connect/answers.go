package idemconnect

// The contract's answers as Connect errors (idemrpc maps them, as it does
// for contrib/grpc).

import (
	"errors"

	"connectrpc.com/connect"
	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemrpc"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain of every answer the interceptor gives
// instead of the handler's.
const Domain = idemrpc.Domain

// answerError is the Connect error of an answer Exec gave instead of
// running the handler.
func answerError(err error) error {
	var ea *idempotency.ErrorAnswer
	if !errors.As(err, &ea) {
		return connect.NewError(connect.CodeInternal, err)
	}
	a := idemrpc.AnswerOf(ea)
	ce := connect.NewError(connect.Code(a.Code), errors.New(a.Message))
	if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: a.Reason, Domain: Domain, Metadata: a.Metadata}); err == nil {
		ce.AddDetail(d)
	}
	if a.RetryDelay > 0 {
		if d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(a.RetryDelay)}); err == nil {
			ce.AddDetail(d)
		}
	}
	return ce
}

// Unsettled is the error a handler returns when its downstream outcome is
// unknown (a timeout, a dropped connection, a 5xx of a broker):
// CodeUnavailable with an ErrorInfo of reason IDEMPOTENCY_UNSETTLED.
// Nothing is recorded; the caller gets Unavailable
// IDEMPOTENCY_STORE_UNAVAILABLE with a RetryInfo of 1s, and its retry
// reconciles the key (the method's Route.Reconcile), as
// idempotency.Unsettled does over HTTP.
func Unsettled(message string) *connect.Error {
	ce := connect.NewError(connect.CodeUnavailable, errors.New(message))
	if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: idemrpc.ReasonUnsettled, Domain: Domain}); err == nil {
		ce.AddDetail(d)
	}
	return ce
}
