package main

import (
	"net/http"
	"unicode/utf8"
)

// maxNameLength bounds a demo user's name, in characters.
const maxNameLength = 100

// createUser is POST /api/demo/users: a demo account and its bearer token.
// It is deliberately not idempotency-wrapped: its response carries a
// credential, which must never be stored for replay.
func (s *server) createUser(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Name string `json:"name"`
	}
	if !readJSON(w, r, &in, "invalid_user", true) {
		return
	}
	if utf8.RuneCountInString(in.Name) > maxNameLength {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_user", "message": "name must be at most 100 characters"})
		return
	}
	uid, err := s.data.createUser(r.Context(), in.Name)
	if err != nil {
		s.dbError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"user_id": uid, "name": in.Name, "token": s.sessions.token(uid)})
}
