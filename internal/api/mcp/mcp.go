// Package mcp serves the controller over the Model Context Protocol, on
// stdio and on streamable HTTP, with the official Go SDK. Every capability
// of the registry is one MCP tool — name, description, input and output
// schema taken from the registry as they are. The package only translates:
// a tool call in, a controller call, a tool result out.
//
// A result carries the model-facing text as text content and the output as
// structured content; run_code's artifacts follow as more content (PNG and
// JPEG as images, SVG rasterised to a PNG image and kept as an embedded
// resource, HTML and the rest as embedded resources), and read_file of an
// image answers image content. A failure of the
// call (a *capability.Error) is a tool result with isError set and a text
// naming the code, as MCP wants for tool execution errors; a tool that does
// not exist stays a protocol error.
package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/quro-dev/quro/internal/api/streamcap"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/picture"
	"github.com/quro-dev/quro/internal/progress"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/version"
)

// Path is the access path MCP callers carry (controller.Caller.Path).
const Path = "mcp"

// Options configure the MCP server. nil means defaults.
type Options struct {
	Logger *slog.Logger
	// ProgressEvery is how often a call whose client gave a progress token
	// is told that it is still running (1 s).
	ProgressEvery time.Duration
	// SessionTimeout closes an MCP session over HTTP that saw no request for
	// this long (30 min); a call in flight keeps it open.
	SessionTimeout time.Duration
	// MaxSessions and MaxSessionsPerCaller cap the MCP sessions over HTTP
	// held at once, in all (512) and per caller (32); see Handler.
	MaxSessions, MaxSessionsPerCaller int
	// MaxSessionsPerTenant is each tenant's share of MaxSessions, for all
	// its callers together (a quarter, at least MaxSessionsPerCaller).
	MaxSessionsPerTenant int
	// Streams caps the event streams (GET /mcp) each token holds, shared
	// with the other routes that hold streams (WebSocket); nil: no cap.
	Streams *streamcap.Limiter
	// StreamIdleTimeout ends an event stream (GET /mcp) whose client has
	// not answered a ping for this long (DefaultStreamIdleTimeout); the
	// server pings on the stream every quarter of it. MCP clients answer
	// pings (the specification says they must), so one that is still
	// there keeps its stream. Only the stream ends, not the session: its
	// calls go on over POST. A client's answers to the pings are requests
	// of its session, so a session whose client answers is never idle;
	// one whose stream ended gets no more pings, and SessionTimeout frees
	// it when it is abandoned.
	StreamIdleTimeout time.Duration
	// Tools names the tool profile tools/list shows (capability.Profile):
	// "" is capability.DefaultProfile. Over HTTP a client's ?tools= and
	// its token's default come first.
	Tools string
}

// DefaultStreamIdleTimeout is Options.StreamIdleTimeout's default: pings
// every 30 s, each answered within 2 min.
const DefaultStreamIdleTimeout = 2 * time.Minute

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	if r.ProgressEvery <= 0 {
		r.ProgressEvery = time.Second
	}
	if r.SessionTimeout <= 0 {
		r.SessionTimeout = 30 * time.Minute
	}
	if r.StreamIdleTimeout <= 0 {
		r.StreamIdleTimeout = DefaultStreamIdleTimeout
	}
	return r
}

// LocalCaller is who a local stdio client is: the machine's user, with
// every scope, like the CLI.
var LocalCaller = controller.Caller{Path: Path, Scope: capability.ScopeAdmin}

// NewServer returns an MCP server exposing every capability of ctl, called
// as caller (its Path is set to "mcp"), and listing the tools of the
// profile Options.Tools names; an unknown profile is an error.
func NewServer(ctl *controller.Controller, caller controller.Caller, opts *Options) (*mcp.Server, error) {
	caller.Path = Path
	o := opts.withDefaults()
	p, err := Profile(ctl.Registry(), o.Tools)
	if err != nil {
		return nil, err
	}
	s, _ := newServer(ctl, caller, "", o, "", &schemas{}, p)
	return s, nil
}

// ServeStdio serves one MCP session on r and w (a client's pipes: standard
// input and output for `quro mcp`) as the local caller, until the client
// closes its end or ctx ends.
func ServeStdio(ctx context.Context, ctl *controller.Controller, r io.Reader, w io.Writer, opts *Options) error {
	s, err := NewServer(ctl, LocalCaller, opts)
	if err != nil {
		return err
	}
	t := &mcp.IOTransport{Reader: io.NopCloser(r), Writer: nopWriteCloser{w}}
	return s.Run(ctx, t)
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// tool is one capability as the server calls it.
type tool struct {
	ctl    *controller.Controller
	name   string
	caller controller.Caller
	// cred is the credential caller authenticated with (an Authorization
	// header; "" for none): a call another node owns is authenticated
	// there with it (controller.WithCredential). The MCP session is
	// pinned to caller, so every request of it presents this token.
	cred   string
	cap    *capability.Capability
	output *jsonschema.Resolved // nil when the schema cannot be resolved
	opts   Options
}

// schemas are the capabilities' output schemas resolved, once for all the
// servers of a handler (resolving them all took most of a new session's
// server).
type schemas struct {
	mu sync.Mutex
	m  map[*capability.Capability]*jsonschema.Resolved // nil: does not resolve
}

func (s *schemas) output(c *capability.Capability, log *slog.Logger) *jsonschema.Resolved {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.m[c]; ok {
		return r
	}
	r, err := c.OutputSchema.Resolve(nil)
	if err != nil {
		log.Error("mcp: output schema does not resolve; outputs go unchecked", "tool", c.Name, "err", err)
		r = nil
	}
	if s.m == nil {
		s.m = map[*capability.Capability]*jsonschema.Resolved{}
	}
	s.m[c] = r
	return r
}

// newServer builds the server and returns its tools by name; a non-empty
// sessionID is the id of the one HTTP session it will serve. Every
// capability is a tool the caller may call (the controller checks its
// scope, as for REST and the CLI); tools/list shows only profile's members
// that the caller's scope covers, in profile's order.
func newServer(ctl *controller.Controller, caller controller.Caller, cred string, opts Options, sessionID string, sc *schemas, profile capability.Profile) (*mcp.Server, map[string]*tool) {
	var getID func() string
	if sessionID != "" {
		getID = func() string { return sessionID }
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "quro", Title: "Quro", Version: version.String()}, &mcp.ServerOptions{
		Logger:       opts.Logger,
		GetSessionID: getID,
		Instructions: Instructions,
	})
	reg := ctl.Registry()
	members := reg.Members(profile, caller.Scope)
	listed := make(map[string]int, len(members)) // the order listed
	for i, c := range members {
		listed[c.Name] = i
	}
	tools := map[string]*tool{}
	for _, c := range reg.List() {
		t := &tool{ctl: ctl, name: c.Name, caller: caller, cred: cred, cap: c, opts: opts, output: sc.output(c, opts.Logger)}
		tools[c.Name] = t
		desc, input := c.Description, c.InputSchema
		if _, ok := listed[c.Name]; ok {
			desc, input = c.Listing(profile)
		}
		s.AddTool(&mcp.Tool{
			Name: c.Name, Description: desc,
			InputSchema: input, OutputSchema: c.OutputSchema,
			Annotations: annotations(c),
		}, t.call)
	}
	s.AddReceivingMiddleware(listOnly(listed))
	return s, tools
}

// Instructions is what the server tells a client at initialize: short, for
// a model's context.
const Instructions = "Quro runs code (run_code) and shell commands (terminal_exec) in isolated, persistent sessions. " +
	"The workspace is /home/user; relative paths start there. help is a short guide; help {topic} says more."

// listOnly makes tools/list answer the tools of listed only, in its order.
func listOnly(listed map[string]int) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if lt, ok := res.(*mcp.ListToolsResult); ok && err == nil && method == "tools/list" {
				kept := lt.Tools[:0:0]
				for _, t := range lt.Tools {
					if _, ok := listed[t.Name]; ok {
						kept = append(kept, t)
					}
				}
				slices.SortStableFunc(kept, func(a, b *mcp.Tool) int { return listed[a.Name] - listed[b.Name] })
				lt.Tools = kept
			}
			return res, err
		}
	}
}

// Profile returns the tool profile called name ("": the default), or an
// error that names the profiles there are.
func Profile(reg *capability.Registry, name string) (capability.Profile, error) {
	if name == "" {
		name = capability.DefaultProfile
		if _, ok := reg.Profile(name); !ok {
			name = capability.FullProfile // a registry without profiles
		}
	}
	p, ok := reg.Profile(name)
	if !ok {
		return p, capability.Errorf(capability.InvalidArgument, "no tool profile %q: the profiles are %s", name, strings.Join(reg.ProfileNames(), ", "))
	}
	return p, nil
}

// annotations are the capability's hints (capability.Hints) as MCP says
// them. DestructiveHint and OpenWorldHint default to true in MCP, so both
// are always said.
func annotations(c *capability.Capability) *mcp.ToolAnnotations {
	h := c.Hints
	a := &mcp.ToolAnnotations{ReadOnlyHint: h.ReadOnly, IdempotentHint: h.Idempotent || h.ReadOnly, OpenWorldHint: &h.OpenWorld}
	if !h.ReadOnly {
		a.DestructiveHint = &h.Destructive
	}
	return a
}

func (t *tool) call(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	if tok := req.Params.GetProgressToken(); tok != nil && req.Session != nil {
		// What the call reports (the first run's preparation of the
		// embedded Python) goes into the next notification.
		var latest atomic.Pointer[string]
		ctx = progress.With(ctx, func(msg string) { latest.Store(&msg) })
		stop := t.progress(ctx, req.Session, tok, &latest)
		defer stop()
	}
	reply, err := t.ctl.Call(controller.WithCredential(ctx, t.cred), t.caller, t.name, req.Params.Arguments)
	if err != nil {
		return errorResult(controller.Classify(err)), nil
	}
	// The output as its schema says it: a nil list is [], not null.
	structured, err := t.cap.Structured(reply.Output)
	if err == nil && t.output != nil {
		err = validate(t.output, structured)
	}
	if err != nil {
		// The registry promises this schema; a client that checks it would
		// reject the whole result, so say plainly what went wrong.
		t.opts.Logger.Error("mcp: output does not match its schema", "tool", t.name, "err", err)
		res := errorResult(capability.Errorf(capability.Internal, "the output of %s does not match its schema: %v", t.name, err))
		res.Content = append(res.Content, &mcp.TextContent{Text: reply.Text})
		return res, nil
	}
	res := &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: reply.Text}},
		StructuredContent: structured,
	}
	var more []mcp.Content
	var notes []string
	switch out := reply.Output.(type) {
	case *runcode.Result:
		more, notes = artifacts(out)
	case imageFile:
		more, notes = fileImage(out)
	}
	res.Content = append(res.Content, more...)
	if len(notes) > 0 {
		text := res.Content[0].(*mcp.TextContent)
		text.Text = strings.TrimRight(text.Text, "\n") + "\nℹ️ " + strings.Join(notes, "\nℹ️ ")
	}
	return res, nil
}

// imageFile is an output that may be a whole image file (read_file's).
type imageFile interface {
	Image() (data []byte, mime string, ok bool)
}

// fileImage is an image file as image content: a raster image as it is
// (within picture.MaxImage), an SVG rasterised to PNG; notes say why not.
func fileImage(f imageFile) ([]mcp.Content, []string) {
	data, mime, ok := f.Image()
	if !ok {
		return nil, nil
	}
	if mime == "image/svg+xml" {
		png, err := picture.SVGToPNG(data)
		if err != nil {
			return nil, []string{"not shown as an image: " + err.Error()}
		}
		return []mcp.Content{&mcp.ImageContent{Data: png, MIMEType: "image/png"}}, nil
	}
	if len(data) > picture.MaxImage {
		return nil, []string{fmt.Sprintf("not shown as an image: it is %s, over the %s a model takes; make a smaller copy with run_code",
			runcode.HumanBytes(int64(len(data))), runcode.HumanBytes(picture.MaxImage))}
	}
	return []mcp.Content{&mcp.ImageContent{Data: data, MIMEType: mime}}, nil
}

func validate(s *jsonschema.Resolved, data []byte) error {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	return s.Validate(v)
}

// errorResult is a failed call as MCP wants a tool execution error: a
// result with isError, for the model to read and act on.
func errorResult(e *capability.Error) *mcp.CallToolResult {
	return &mcp.CallToolResult{
		IsError: true,
		Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("⚠️ error %s: %s", e.Code, e.Message)}},
		Meta:    mcp.Meta{"quro/error": e},
	}
}

// artifacts maps run_code's artifacts to content: PNG and JPEG are
// images; an SVG is rasterised to a PNG image (model APIs take no SVG)
// and kept as an embedded resource; everything else (HTML pages,
// markdown, JSON, text) is an embedded resource with its media type. The
// images of rich results (image/png, image/jpeg, image/svg+xml) follow
// likewise. A PNG or JPEG whose data is not base64 is skipped; the text
// names it. notes say what could not be shown as an image.
func artifacts(r *runcode.Result) (out []mcp.Content, notes []string) {
	rasters := 0
	svg := func(name, uri, data string) {
		out = append(out, &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: uri, MIMEType: "image/svg+xml", Text: data}})
		if rasters++; rasters > maxRasters {
			if rasters == maxRasters+1 {
				notes = append(notes, fmt.Sprintf("only the first %d SVG images were rasterised; the others are attached as SVG only", maxRasters))
			}
			return
		}
		png, err := picture.SVGToPNG([]byte(data))
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s is not shown as an image (%v); it is attached as SVG", name, err))
			return
		}
		out = append(out, &mcp.ImageContent{Data: png, MIMEType: "image/png"})
	}
	for _, a := range r.Artifacts {
		switch a.Kind {
		case "png", "jpeg":
			b, err := base64.StdEncoding.DecodeString(a.Data)
			if err != nil {
				continue
			}
			out = append(out, &mcp.ImageContent{Data: b, MIMEType: "image/" + a.Kind})
		case "svg":
			svg(a.Name, artifactURI(r.Session, a.Name), a.Data)
		default:
			// The media type is the kind's own, never the artifact's MIME
			// field: a box's code can forge its worker's reply.
			mime, ok := artifactMIME[a.Kind]
			if !ok {
				mime = "text/plain"
			}
			out = append(out, &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{
				URI:      artifactURI(r.Session, a.Name),
				MIMEType: mime,
				Text:     a.Data,
			}})
		}
	}
	for i, res := range r.Results {
		for _, mime := range []string{"image/png", "image/jpeg"} {
			if s, ok := res.Data[mime].(string); ok {
				if b, err := base64.StdEncoding.DecodeString(s); err == nil {
					out = append(out, &mcp.ImageContent{Data: b, MIMEType: mime})
				}
			}
		}
		if s, ok := res.Data["image/svg+xml"].(string); ok {
			name := fmt.Sprintf("result-%d.svg", i+1)
			svg(name, artifactURI(r.Session, name), s)
		}
	}
	return out, notes
}

// maxRasters bounds the SVGs one result has rasterised: each may cost
// up to a second or two of the server's CPU.
const maxRasters = 4

// artifactMIME is the media type of each text kind of artifact
// (runcode.Artifact.Kind); any other kind is text/plain.
var artifactMIME = map[string]string{
	"html":     "text/html",
	"markdown": "text/markdown",
	"latex":    "text/latex",
	"json":     "application/json",
	"text":     "text/plain",
}

func artifactURI(session, name string) string {
	return "quro://sessions/" + url.PathEscape(session) + "/artifacts/" + url.PathEscape(name)
}

// progress tells the client every ProgressEvery that the call still runs,
// until the returned stop is called; stop returns once no notification can
// follow, so none arrives after the result.
func (t *tool) progress(ctx context.Context, ss *mcp.ServerSession, token any, latest *atomic.Pointer[string]) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		tick := time.NewTicker(t.opts.ProgressEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case now := <-tick.C:
				elapsed := now.Sub(start)
				msg := fmt.Sprintf("%s running for %s", t.name, elapsed.Round(100*time.Millisecond))
				if m := latest.Load(); m != nil {
					msg += ": " + *m
				}
				err := ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: token,
					Progress:      elapsed.Seconds(),
					Message:       msg,
				})
				if err != nil && ctx.Err() == nil {
					t.opts.Logger.Debug("mcp: progress notification failed", "tool", t.name, "err", err)
				}
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

// describe is a one-line summary of a caller for logs.
func describe(c controller.Caller) string {
	var parts []string
	if c.Tenant != "" {
		parts = append(parts, "tenant="+c.Tenant)
	}
	if c.TokenID != "" {
		parts = append(parts, "token="+c.TokenID)
	}
	parts = append(parts, "scope="+string(c.Scope))
	return strings.Join(parts, " ")
}
