package e2b

import "net/http"

// interpRoutes serves the code interpreter: /execute, /contexts, /health.
func (s *Server) interpRoutes(m *http.ServeMux) {}
