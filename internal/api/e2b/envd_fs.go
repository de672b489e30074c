package e2b

import "net/http"

// envdFSRoutes serves envd's filesystem.Filesystem (Connect-RPC), GET and
// POST /files and GET /health.
func (s *Server) envdFSRoutes(m *http.ServeMux) {}
