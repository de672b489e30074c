package sandbox

import "fmt"

// checkSessionRun refuses a run in a session's directory (Options.SessionOf)
// that is not spawned in that session's box: one that names no session —
// neither Spec.Session nor a ForSession sandbox — without saying why it
// runs outside (Spec.Outside), or one that names another session's box.
// Such a run would silently get a box of its own: a pause would not
// freeze it and a destroy would not kill it.
func (s *Sandbox) checkSessionRun(spec *Spec) error {
	if s.sessionOf == nil {
		return nil
	}
	id, ok := s.sessionOf(spec.Dir)
	if !ok {
		return nil
	}
	key := spec.Session
	if key == "" {
		key = s.session
	}
	switch {
	case key == "" && spec.Outside == "":
		return fmt.Errorf("%w: a run in the directory of session %s names no session box: build it from the session (session.Session.Spec or Sandbox), or name why it runs outside (Spec.Outside)", ErrInvalidSpec, id)
	case key != "" && key != id:
		return fmt.Errorf("%w: a run in the directory of session %s names the box of session %s", ErrInvalidSpec, id, key)
	}
	return nil
}
