package appliance

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"

	"golang.org/x/crypto/bcrypt"
)

// BasicAuth protects the status page and the JSON API with HTTP basic
// authentication. Health endpoints and /metrics stay open.
type BasicAuth struct {
	user string
	// Exactly one of hash (bcrypt) and plain (sha256 of the password) is set.
	hash  []byte
	plain [sha256.Size]byte

	// bcrypt is slow on purpose; a page polling every few seconds would pay
	// it on every request. Remember the digest of the last credentials that
	// passed bcrypt so repeated requests compare in constant time instead.
	mu       sync.Mutex
	verified [sha256.Size]byte
	haveOK   bool
}

// NewBasicAuth accepts user with a bcrypt password hash, as written by
// `htpasswd -nbB user password` (the part after the colon) or `mkpasswd -m bcrypt`.
func NewBasicAuth(user, bcryptHash string) (*BasicAuth, error) {
	if err := checkUser(user); err != nil {
		return nil, err
	}
	if _, err := bcrypt.Cost([]byte(bcryptHash)); err != nil {
		return nil, fmt.Errorf("status auth password hash: not a bcrypt hash (want $2a$/$2b$/$2y$...): %v", err)
	}
	return &BasicAuth{user: user, hash: []byte(bcryptHash)}, nil
}

// BasicAuthFromFile accepts user with the password kept in the file at path
// (surrounding white space, such as a trailing newline, is ignored). A file
// whose content is a bcrypt hash is taken as the hash.
func BasicAuthFromFile(user, path string) (*BasicAuth, error) {
	if err := checkUser(user); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("status auth password file %q: %w", path, err)
	}
	pw := strings.TrimSpace(string(b))
	if pw == "" {
		return nil, fmt.Errorf("status auth password file %q: empty", path)
	}
	if _, err := bcrypt.Cost([]byte(pw)); err == nil {
		return &BasicAuth{user: user, hash: []byte(pw)}, nil
	}
	return &BasicAuth{user: user, plain: sha256.Sum256([]byte(pw))}, nil
}

func checkUser(user string) error {
	if user == "" {
		return fmt.Errorf("status auth user: must not be empty")
	}
	if strings.ContainsAny(user, ":\r\n") {
		return fmt.Errorf("status auth user %q: must not contain ':' or line breaks", user)
	}
	return nil
}

// Check reports whether user and password are the configured credentials.
func (a *BasicAuth) Check(user, password string) bool {
	userOK := subtle.ConstantTimeCompare([]byte(user), []byte(a.user)) == 1
	pwSum := sha256.Sum256([]byte(password))
	if a.hash == nil {
		return userOK && subtle.ConstantTimeCompare(pwSum[:], a.plain[:]) == 1
	}
	digest := sha256.Sum256([]byte(user + ":" + password))
	a.mu.Lock()
	cached := a.haveOK && subtle.ConstantTimeCompare(digest[:], a.verified[:]) == 1
	a.mu.Unlock()
	if cached {
		return true
	}
	if !userOK || bcrypt.CompareHashAndPassword(a.hash, []byte(password)) != nil {
		return false
	}
	a.mu.Lock()
	a.verified, a.haveOK = digest, true
	a.mu.Unlock()
	return true
}

func (a *BasicAuth) wrap(h http.Handler) http.Handler {
	if a == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pw, ok := r.BasicAuth()
		if !ok || !a.Check(user, pw) {
			w.Header().Set("WWW-Authenticate", `Basic realm="nftgate", charset="UTF-8"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
