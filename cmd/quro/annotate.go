package main

import (
	"strings"

	"github.com/spf13/cobra"
)

// Every runnable command says what it is (bypass_test.go walks the tree
// and fails on one that does not):
//
//   - annCapabilities: the capabilities it calls through the controller
//     (in-process as the local admin, path "cli", or through a server),
//     comma-separated; "*" for quro call, which calls the one it is
//     given. Every change of state goes this way, so the audit log has
//     it whatever the access path.
//   - annLocal: why it needs no capability: it changes no state (version,
//     status), or it is an access path itself (serve, mcp).
const (
	annCapabilities = "quro.capabilities"
	annLocal        = "quro.local"
)

// annotate records the capabilities cmd calls.
func annotate(cmd *cobra.Command, capabilities ...string) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annCapabilities] = strings.Join(capabilities, ",")
	return cmd
}

// local records why cmd calls no capability.
func local(cmd *cobra.Command, reason string) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annLocal] = reason
	return cmd
}

// operatorOutput calls a capability through the operator's backend (see
// operatorBackend) and decodes its output into out.
func (g *globals) operatorOutput(cmd *cobra.Command, name string, in, out any) error {
	b, err := g.operatorBackend(cmd)
	if err != nil {
		return err
	}
	defer b.close()
	return b.output(cmd.Context(), name, in, out)
}
