// Package recent is a set that keeps only its most recent keys. The
// sandbox, the terminal manager and the App each mark destroyed sessions
// in one, so that a call racing with a destroy cannot bring a session back
// (make it a box, a shell, a run), without the set growing for the life of
// the server: a session id is never reused, and a call still racing after
// thousands of later destroys is not plausible.
package recent

// DefaultMax is how many keys a Set keeps when Max is 0.
const DefaultMax = 4096

// Set is a set of strings that forgets its oldest key once it holds more
// than Max. The zero value is ready to use. A Set is not safe for
// concurrent use: its owner guards it with the lock it already holds.
type Set struct {
	Max   int
	has   map[string]bool
	order []string
}

// Add puts key in the set, forgetting the oldest key past Max.
func (s *Set) Add(key string) {
	if s.has[key] {
		return
	}
	if s.has == nil {
		s.has = map[string]bool{}
	}
	s.has[key] = true
	s.order = append(s.order, key)
	max := s.Max
	if max <= 0 {
		max = DefaultMax
	}
	if len(s.order) > max {
		delete(s.has, s.order[0])
		s.order = s.order[1:]
	}
}

// Delete takes key out of the set (a session's move that failed: it is
// usable again).
func (s *Set) Delete(key string) {
	if !s.has[key] {
		return
	}
	delete(s.has, key)
	for i, k := range s.order {
		if k == key {
			s.order = append(s.order[:i], s.order[i+1:]...)
			break
		}
	}
}

// Has reports whether key is in the set.
func (s *Set) Has(key string) bool { return s.has[key] }
