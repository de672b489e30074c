package e2b

import "net/http"

// controlRoutes serves E2B's control plane (the REST API of
// E2B_API_URL): sandboxes' lifecycle.
func (s *Server) controlRoutes(m *http.ServeMux) {}
