package rest

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// Transfers: the web UI's file download and upload, streamed. Both are made
// of the workspace capabilities (stat_file, read_file, list_files,
// write_file, move_file, remove_file) called as the request's caller, so
// they reach what those reach and nothing else (the tenant's own sessions,
// the workspace through its one layer); bytes move in chunks of
// TransferChunk, never a whole file in memory. A transfer is audited once
// (controller.WithTransfer): as read_file (a download) or write_file (an
// upload) with its path, the bytes moved and the calls it took.
//
//	GET /v1/sessions/{id}/download/{path...}  a file's bytes; a directory
//	    (or the workspace, with an empty path) as a .tar.gz made on the fly
//	PUT /v1/sessions/{id}/upload/{path...}    the raw body becomes the
//	    file: written to a hidden file beside it, then moved over it, so a
//	    failed upload (a full disk, a cut connection, past MaxUpload)
//	    leaves the old file as it was and no part behind.
const (
	// TransferChunk is the bytes one read_file or write_file call moves
	// (under their 8 MiB bound).
	TransferChunk = 4 << 20
	// MaxUpload bounds one upload: a session's disk quota stops it sooner
	// where the kernel has quotas; this stops it where it has none.
	MaxUpload = 1 << 30
	// maxArchiveEntries bounds a folder download (list_files' most).
	maxArchiveEntries = 10000
)

// transferRoutes are the streamed routes, served besides the table's
// (they are not one capability call each, so OpenAPI has them by hand).
var transferRoutes = []struct{ Method, Pattern, Summary string }{
	{"GET", "/v1/sessions/{id}/download/{path...}", "Download a workspace file, or a directory as a .tar.gz, streamed"},
	{"PUT", "/v1/sessions/{id}/upload/{path...}", "Upload the raw body as a workspace file, streamed; the file is replaced only when the whole body is in"},
}

// transferPath checks the wildcard: a workspace-relative path. An absolute
// path (a box's own, which read_file would serve) is not for these routes.
func transferPath(r *http.Request) (string, *capability.Error) {
	p := strings.TrimSuffix(r.PathValue("path"), "/")
	if strings.HasPrefix(p, "/") {
		return "", capability.Errorf(capability.InvalidArgument, "give the path relative to the workspace /home/user, not %q", p)
	}
	if p == "" {
		p = "."
	}
	if c := path.Clean(p); c == ".." || strings.HasPrefix(c, "../") {
		// The workspace layer refuses it too; this names the path asked
		// for, not the upload's hidden file beside it.
		return "", capability.Errorf(capability.PermissionDenied, "%q leads out of the session workspace /home/user", p)
	}
	return p, nil
}

func (s *server) transferError(w http.ResponseWriter, err error) {
	if controller.NoSpace(err) {
		ce := controller.Classify(err)
		WriteError(w, http.StatusInsufficientStorage, ce)
		return
	}
	ce := controller.Classify(err)
	WriteError(w, Status(ce.Code), ce)
}

// The capabilities' inputs and outputs, as far as the transfers read them
// (package app's types; rest does not import app, whose tests import
// rest).
type (
	entry struct {
		Name    string    `json:"name"`
		Path    string    `json:"path"`
		Type    string    `json:"type"`
		Size    int64     `json:"size"`
		Mode    string    `json:"mode"`
		ModTime time.Time `json:"mtime"`
		Target  string    `json:"target,omitempty"`
	}
	fileContent struct {
		Path     string `json:"path"`
		Encoding string `json:"encoding"`
		Content  string `json:"content"`
		Size     int64  `json:"size"`
	}
	fileInfo struct {
		Entry *entry `json:"entry"`
	}
	fileList struct {
		Path      string  `json:"path"`
		Entries   []entry `json:"entries"`
		Truncated bool    `json:"truncated"`
	}
)

// invoke calls capability name with in as the caller and decodes its
// output into out (nil: not decoded); it returns the output as it was.
func invoke(ctx context.Context, s *server, caller controller.Caller, name string, in map[string]any, out any) (any, error) {
	args, err := json.Marshal(in)
	if err != nil {
		return nil, capability.Errorf(capability.Internal, "%s's input: %v", name, err)
	}
	reply, err := s.ctl.Call(ctx, caller, name, args)
	if err != nil {
		return nil, err
	}
	if out != nil {
		b, err := json.Marshal(reply.Output)
		if err == nil {
			err = json.Unmarshal(b, out)
		}
		if err != nil {
			return nil, capability.Errorf(capability.Internal, "%s's output: %v", name, err)
		}
	}
	return reply.Output, nil
}

func (s *server) readChunk(ctx context.Context, caller controller.Caller, session, rel string, off int64) (*fileContent, []byte, error) {
	c := &fileContent{}
	if _, err := invoke(ctx, s, caller, "read_file", map[string]any{"session": session, "path": rel, "offset": off, "limit": TransferChunk}, c); err != nil {
		return nil, nil, err
	}
	if c.Encoding == "base64" {
		b, err := base64.StdEncoding.DecodeString(c.Content)
		if err != nil {
			return nil, nil, capability.Errorf(capability.Internal, "read_file's content: %v", err)
		}
		return c, b, nil
	}
	return c, []byte(c.Content), nil
}

// download serves GET .../download/{path...}.
func (s *server) download(w http.ResponseWriter, r *http.Request) {
	caller, ok := s.access.Admit(w, r, "rest")
	if !ok {
		return
	}
	rel, cerr := transferPath(r)
	if cerr != nil {
		WriteError(w, Status(cerr.Code), cerr)
		return
	}
	session := r.PathValue("id")
	ctx, t := controller.WithTransfer(r.Context())
	var (
		sent int64
		terr error
	)
	defer func() {
		s.ctl.EndTransfer(context.WithoutCancel(r.Context()), t, caller, "read_file", map[string]any{"session": session, "path": rel, "transfer": "download"}, sent, terr)
	}()
	info := &fileInfo{}
	if _, err := invoke(ctx, s, caller, "stat_file", map[string]any{"session": session, "path": rel}, info); err != nil {
		terr = err
		s.transferError(w, err)
		return
	}
	if info.Entry == nil {
		ce := capability.Errorf(capability.Internal, "stat_file answered no entry")
		terr = ce
		WriteError(w, http.StatusInternalServerError, ce)
		return
	}
	if info.Entry.Type == "dir" {
		s.downloadDir(ctx, w, r, caller, session, rel, &sent, &terr)
		return
	}
	c, b, err := s.readChunk(ctx, caller, session, rel, 0)
	if err != nil {
		terr = err
		s.transferError(w, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(c.Path)}))
	h.Set("Content-Length", strconv.FormatInt(c.Size, 10))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	cw := &counter{w: w}
	if err := s.copyFile(ctx, cw, caller, session, c, b); err != nil {
		sent, terr = cw.n, err // the deferred EndTransfer runs as the panic unwinds
		s.log.Warn("rest: download cut", "session", session, "path", c.Path, "err", err)
		panic(http.ErrAbortHandler) // the status is out: only a cut body says it failed
	}
	sent = cw.n
}

// counter counts the bytes written through it.
type counter struct {
	w io.Writer
	n int64
}

func (c *counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// copyFile writes the file whose first chunk is c (its bytes b) to w, to
// the size c gave: a file that grew is cut there, one that shrank is an
// error (never a silently short file).
func (s *server) copyFile(ctx context.Context, w io.Writer, caller controller.Caller, session string, c *fileContent, b []byte) error {
	size, p := c.Size, c.Path
	var off int64
	for {
		if int64(len(b)) > size-off {
			b = b[:size-off]
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		off += int64(len(b))
		if off >= size {
			return nil
		}
		if len(b) == 0 {
			return fmt.Errorf("%s shrank to %d bytes while it was sent (it had %d)", p, off, size)
		}
		var err error
		if _, b, err = s.readChunk(ctx, caller, session, p, off); err != nil {
			return err
		}
	}
}

// downloadDir streams the directory rel as a gzipped tar whose entries
// are under its name ("user/" for the workspace itself); it sets *sent to
// the archive's bytes sent and *terr to how it failed, for the audit.
func (s *server) downloadDir(ctx context.Context, w http.ResponseWriter, r *http.Request, caller controller.Caller, session, rel string, sent *int64, terr *error) {
	list := &fileList{}
	if _, err := invoke(ctx, s, caller, "list_files", map[string]any{"session": session, "path": rel, "recursive": true, "max_entries": maxArchiveEntries}, list); err != nil {
		*terr = err
		s.transferError(w, err)
		return
	}
	if list.Truncated {
		ce := capability.Errorf(capability.InvalidArgument,
			"/home/user/%s has more than %d entries: download a subdirectory, or pack it in the session (tar czf)", strings.TrimPrefix(rel, "."), maxArchiveEntries)
		*terr = ce
		WriteError(w, http.StatusRequestEntityTooLarge, ce)
		return
	}
	root := path.Base(list.Path)
	if list.Path == "." || list.Path == "" {
		root = "user"
	}
	h := w.Header()
	h.Set("Content-Type", "application/gzip")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": root + ".tar.gz"}))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	cw := &counter{w: w}
	defer func() { *sent = cw.n }()
	gz, _ := gzip.NewWriterLevel(cw, gzip.BestSpeed) // a valid level: no error
	tw := tar.NewWriter(gz)
	base := strings.TrimPrefix(list.Path, ".")
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: root + "/", Mode: 0o755, ModTime: time.Now(), Format: tar.FormatPAX}); err != nil {
		return
	}
	for _, e := range list.Entries {
		name := root + "/" + strings.TrimPrefix(strings.TrimPrefix(e.Path, base), "/")
		mode, _ := strconv.ParseInt(e.Mode, 8, 64)
		hdr := &tar.Header{Name: name, Mode: mode & 0o777, ModTime: e.ModTime, Format: tar.FormatPAX}
		switch e.Type {
		case "dir":
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		case "symlink":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.Target // what the link says; not followed
		case "file":
			hdr.Typeflag = tar.TypeReg
		default:
			continue // a fifo or socket has no bytes to pack
		}
		if e.Type != "file" {
			if err := tw.WriteHeader(hdr); err != nil {
				return
			}
			continue
		}
		c, b, err := s.readChunk(ctx, caller, session, e.Path, 0)
		if err != nil {
			*sent, *terr = cw.n, err
			s.log.Warn("rest: folder download cut", "session", session, "path", e.Path, "err", err)
			panic(http.ErrAbortHandler)
		}
		hdr.Size = c.Size
		if err := tw.WriteHeader(hdr); err != nil {
			return
		}
		if err := s.copyFile(ctx, tw, caller, session, c, b); err != nil {
			*sent, *terr = cw.n, err
			s.log.Warn("rest: folder download cut", "session", session, "path", e.Path, "err", err)
			panic(http.ErrAbortHandler)
		}
	}
	if tw.Close() == nil {
		_ = gz.Close() // an error here is the client gone: nothing to tell it
	}
}

// upload serves PUT .../upload/{path...}.
func (s *server) upload(w http.ResponseWriter, r *http.Request) {
	caller, ok := s.access.Admit(w, r, "rest")
	if !ok {
		return
	}
	rel, cerr := transferPath(r)
	if cerr == nil && rel == "." {
		cerr = capability.Errorf(capability.InvalidArgument, "name the file to upload: PUT /v1/sessions/{id}/upload/<path>")
	}
	if cerr != nil {
		WriteError(w, Status(cerr.Code), cerr)
		return
	}
	if r.ContentLength > MaxUpload {
		WriteError(w, http.StatusRequestEntityTooLarge, capability.Errorf(capability.InvalidArgument,
			"the upload is %d bytes, over the %d (1 GiB) one upload may be: make the file in the session instead", r.ContentLength, MaxUpload))
		return
	}
	session := r.PathValue("id")
	ctx, t := controller.WithTransfer(r.Context())
	var (
		received int64
		terr     error
	)
	defer func() {
		s.ctl.EndTransfer(context.WithoutCancel(r.Context()), t, caller, "write_file", map[string]any{"session": session, "path": rel, "transfer": "upload"}, received, terr)
	}()
	var rnd [8]byte
	_, _ = rand.Read(rnd[:]) // crypto/rand does not fail
	tmp := path.Join(path.Dir(rel), ".quro-upload-"+hex.EncodeToString(rnd[:]))
	write := func(data []byte, appendTo bool) error {
		_, err := invoke(ctx, s, caller, "write_file", map[string]any{"session": session, "path": tmp,
			"content": base64.StdEncoding.EncodeToString(data), "encoding": "base64", "append": appendTo}, nil)
		return err
	}
	if err := write(nil, false); err != nil {
		terr = err
		s.transferError(w, err)
		return
	}
	done := false
	defer func() {
		if !done { // nothing half-made stays behind, even when the client went away
			_, _ = invoke(context.WithoutCancel(ctx), s, caller, "remove_file", map[string]any{"session": session, "path": tmp}, nil)
		}
	}()
	body := http.MaxBytesReader(w, r.Body, MaxUpload)
	buf := make([]byte, TransferChunk)
	for {
		n, rerr := io.ReadFull(body, buf)
		if n > 0 {
			if err := write(buf[:n], true); err != nil {
				terr = err
				s.transferError(w, err)
				return
			}
			received += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			var mbe *http.MaxBytesError
			if errors.As(rerr, &mbe) {
				ce := capability.Errorf(capability.InvalidArgument,
					"the upload is over the %d bytes (1 GiB) one upload may be: make the file in the session instead", MaxUpload)
				terr = ce
				WriteError(w, http.StatusRequestEntityTooLarge, ce)
				return
			}
			ce := capability.Errorf(capability.InvalidArgument, "reading the upload: %v", rerr)
			terr = ce
			WriteError(w, http.StatusBadRequest, ce)
			return
		}
	}
	moved, err := invoke(ctx, s, caller, "move_file", map[string]any{"session": session, "source": tmp, "destination": rel}, nil)
	if err != nil {
		terr = err
		s.transferError(w, err)
		return
	}
	done = true
	WriteJSON(w, http.StatusOK, moved)
}

// transferOperation is the OpenAPI operation of a transfer route.
func transferOperation(method, summary string) map[string]any {
	params := []any{
		map[string]any{"name": "id", "in": "path", "required": true, "schema": map[string]any{"type": "string"}, "description": "session id or name"},
		map[string]any{"name": "path", "in": "path", "required": true, "schema": map[string]any{"type": "string"},
			"description": "a workspace-relative path; it may contain /. Empty downloads the whole workspace"},
	}
	bytes := map[string]any{"type": "string", "contentMediaType": "application/octet-stream"}
	op := map[string]any{"summary": summary, "tags": []string{"files"}, "parameters": params}
	if method == "GET" {
		op["operationId"] = "download"
		op["x-quro-capability"] = "read_file"
		op["responses"] = map[string]any{
			"200": map[string]any{"description": "the file's bytes, or the directory as a gzipped tar",
				"content": map[string]any{"application/octet-stream": map[string]any{"schema": bytes}, "application/gzip": map[string]any{"schema": bytes}}},
			"default": ref2("Error"),
		}
		return op
	}
	op["operationId"] = "upload"
	op["x-quro-capability"] = "write_file"
	op["requestBody"] = map[string]any{"required": true, "description": "the file's bytes",
		"content": map[string]any{"application/octet-stream": map[string]any{"schema": bytes}}}
	op["responses"] = responses("200", "the file written, as stat_file gives it", ref("move_file.output"))
	return op
}
