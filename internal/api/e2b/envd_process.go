package e2b

import "net/http"

// envdProcessRoutes serves envd's process.Process (Connect-RPC).
func (s *Server) envdProcessRoutes(m *http.ServeMux) {}
