package idemconnect

// The request hash's input, as contrib/grpc computes it (its golden test
// and this module's pin the same vectors).

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// requestBytes is what the request hash covers besides the full method:
// the deterministic encoding of msg with unknown fields discarded at every
// level (a replica that does not know a field yet must hash alike), after
// a NUL byte, which no JSON text starts with, so the engine hashes it as
// raw bytes.
func requestBytes(msg proto.Message) ([]byte, error) {
	if hasUnknown(msg.ProtoReflect()) {
		msg = proto.Clone(msg)
		discardUnknown(msg.ProtoReflect())
	}
	return proto.MarshalOptions{Deterministic: true}.MarshalAppend([]byte{0}, msg)
}

// eachMessage calls f with every message set in m's fields, at one level.
func eachMessage(m protoreflect.Message, f func(protoreflect.Message) bool) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for l, i := v.List(), 0; i < l.Len(); i++ {
				if !f(l.Get(i).Message()) {
					return false
				}
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			ok := true
			v.Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool { ok = f(v.Message()); return ok })
			return ok
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			return f(v.Message())
		}
		return true
	})
}

// hasUnknown reports whether m or a message inside it has unknown fields.
func hasUnknown(m protoreflect.Message) bool {
	found := len(m.GetUnknown()) > 0
	if !found {
		eachMessage(m, func(m protoreflect.Message) bool { found = hasUnknown(m); return !found })
	}
	return found
}

// discardUnknown drops the unknown fields of m and every message inside it.
func discardUnknown(m protoreflect.Message) {
	if m.GetUnknown() != nil {
		m.SetUnknown(nil)
	}
	eachMessage(m, func(m protoreflect.Message) bool { discardUnknown(m); return true })
}
