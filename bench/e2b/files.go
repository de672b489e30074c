package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// restPart is the most one write_file takes and one read_file gives.
const restPart = 8 << 20

// filesPart writes and reads a -files-mb file of random bytes, -files
// rounds, through the SDK (files.write, files.read as bytes, checked by
// SHA-256), curl on the same /files URL with the same headers, and Quro's
// REST (write_file then appends, read_file by offset and limit, base64).
func filesPart(ctx context.Context, sdk *sdkDriver, rest *restClient, session, tmp, base string) (*part, error) {
	data := make([]byte, *filesMB*1_000_000)
	_, _ = rand.Read(data)
	want := sha256.Sum256(data)
	local := filepath.Join(tmp, "data.bin")
	if err := os.WriteFile(local, data, 0o600); err != nil {
		return nil, err
	}
	var box struct{ ID, Token string }
	if err := sdk.step("files "+local, &box); err != nil {
		return nil, err
	}
	headers := []string{"-H", "E2b-Sandbox-Id: " + box.ID, "-H", "E2b-Sandbox-Port: 49983"}
	if box.Token != "" {
		headers = append(headers, "-H", "X-Access-Token: "+box.Token)
	}
	fileURL := func(p string) string {
		return strings.TrimSuffix(base, "/") + "/files?path=" + url.QueryEscape(p) + "&username=user"
	}
	dir := strings.TrimSuffix(*filesDir, "/")
	sdkPath, curlPath, restPath := dir+"/big.bin", dir+"/curl.bin", dir+"/big.bin"

	// The peer that is not Quro: a plain Go file server (net/http's
	// ServeContent, the same bytes, no gzip) that the SDK's own
	// files.read reaches as its sandbox URL, so that what the SDK and node
	// spend on a read of those bytes is measured apart from Quro's side.
	plain, err := plainFileServer(data)
	if err != nil {
		return nil, err
	}
	defer plain.Close()
	if err := sdk.step("plain http://"+plain.Addr().String(), &struct{}{}); err != nil {
		return nil, err
	}

	sWrite, sRead := &series{name: "SDK files.write"}, &series{name: "SDK files.read (bytes)"}
	cWrite, cRead, cGzip := &series{name: "curl POST /files (octet-stream)"}, &series{name: "curl GET /files"}, &series{name: "curl --compressed GET /files"}
	rWrite, rRead := &series{name: "REST write_file (8 MiB parts, base64)"}, &series{name: "REST read_file (8 MiB parts, base64)"}
	pRead := &series{name: "SDK files.read (bytes) from a plain Go file server"}
	pcRead := &series{name: "curl GET from the plain Go file server"}
	p := &part{title: "files", sdk: []*series{sWrite, sRead}, peers: [][]*series{{cWrite, rWrite}, {cRead, cGzip, rRead, pRead, pcRead}}}
	err = interleave(fmt.Sprintf("files (%d MB)", *filesMB), *nFiles, &p.load, func() error {
		if err := sdk.timed("write "+sdkPath, sWrite); err != nil {
			return err
		}
		return sdk.timed("read "+sdkPath, sRead)
	}, func() error {
		if err := sdk.timed("plainread "+sdkPath, pRead); err != nil {
			return err
		}
		d, err := curl([]string{"http://" + plain.Addr().String() + "/files?path=x"})
		if err != nil {
			return err
		}
		pcRead.add(d)
		d, err = curl(append(headers, "-H", "Content-Type: application/octet-stream", "--data-binary", "@"+local, fileURL(curlPath)))
		if err != nil {
			return err
		}
		cWrite.add(d)
		if d, err = curl(append(headers, fileURL(sdkPath))); err != nil {
			return err
		}
		cRead.add(d)
		if d, err = curl(append([]string{"--compressed"}, append(headers, fileURL(sdkPath))...)); err != nil {
			return err
		}
		cGzip.add(d)
		t := time.Now()
		if err := rest.writeFile(ctx, session, restPath, data); err != nil {
			return err
		}
		rWrite.add(time.Since(t))
		t = time.Now()
		got, err := rest.readFile(ctx, session, restPath)
		if err != nil {
			return err
		}
		rRead.add(time.Since(t))
		if sha256.Sum256(got) != want {
			return fmt.Errorf("read_file gave %d bytes, not the %d written", len(got), len(data))
		}
		return nil
	})
	return p, err
}

// abFilesPart reads a -files-mb file of random bytes, -files rounds, from
// two builds side by side (abRun): the SDK's files.read (bytes, checked by
// SHA-256) and curl's GET of the same /files URL on each, and in every
// round curl from a plain Go file server with the same bytes, the floor
// of a read from a server on this machine at this load.
func abFilesPart(tmp string, a, b *side) (*part, error) {
	data := make([]byte, *filesMB*1_000_000)
	_, _ = rand.Read(data)
	local := filepath.Join(tmp, "data.bin")
	if err := os.WriteFile(local, data, 0o600); err != nil {
		return nil, err
	}
	plain, err := plainFileServer(data)
	if err != nil {
		return nil, err
	}
	defer plain.Close()
	name := strings.TrimSuffix(*filesDir, "/") + "/big.bin"
	type reader struct {
		sd        *side
		get       []string
		sdk, curl *series
		plain     *series
	}
	mk := func(sd *side, which string) (*reader, error) {
		var box struct{ ID, Token string }
		if err := sd.sdk.step("files "+local, &box); err != nil {
			return nil, err
		}
		if err := sd.sdk.step("write "+name, &struct{}{}); err != nil {
			return nil, err
		}
		get := []string{"-H", "E2b-Sandbox-Id: " + box.ID, "-H", "E2b-Sandbox-Port: 49983"}
		if box.Token != "" {
			get = append(get, "-H", "X-Access-Token: "+box.Token)
		}
		get = append(get, strings.TrimSuffix(sd.srv.url, "/")+"/files?path="+url.QueryEscape(name)+"&username=user")
		return &reader{sd: sd, get: get,
			sdk:   &series{name: which + ": SDK files.read (bytes)"},
			curl:  &series{name: which + ": curl GET /files"},
			plain: &series{name: "curl GET from the plain Go file server (in " + which + "'s rounds)"}}, nil
	}
	ra, err := mk(a, "this build")
	if err != nil {
		return nil, err
	}
	rb, err := mk(b, "-before build")
	if err != nil {
		return nil, err
	}
	round := func(r *reader) func() error {
		return func() error {
			if err := r.sd.sdk.timed("read "+name, r.sdk); err != nil {
				return err
			}
			d, err := curl(r.get)
			if err != nil {
				return err
			}
			r.curl.add(d)
			if d, err = curl([]string{"http://" + plain.Addr().String() + "/files?path=x"}); err != nil {
				return err
			}
			r.plain.add(d)
			return nil
		}
	}
	p := &part{title: "files", sdk: []*series{ra.sdk, ra.curl, ra.plain}, peers: [][]*series{{rb.sdk}, {rb.curl}, {rb.plain}}}
	return p, interleave(fmt.Sprintf("files (%d MB), reads", *filesMB), *nFiles, &p.load, round(ra), round(rb))
}

// plainFileServer serves data at every GET on a listener of its own
// (127.0.0.1), as net/http serves a file: Content-Length, no encoding.
func plainFileServer(data []byte) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/octet-stream")
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
		}))
	}()
	return ln, nil
}

// curl runs curl and answers its own total time (-w %{time_total}), so
// that its start-up is not counted.
func curl(args []string) (time.Duration, error) {
	cmd := exec.Command("curl", append([]string{"-sS", "-f", "-o", "/dev/null", "-w", "%{time_total}"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("curl: %v: %s", err, stderr.Bytes())
	}
	s, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	if err != nil {
		return 0, fmt.Errorf("curl's time_total %q: %w", out, err)
	}
	return time.Duration(s * float64(time.Second)), nil
}

// writeFile writes data as a REST client must: base64, in parts.
func (c *restClient) writeFile(ctx context.Context, session, path string, data []byte) error {
	for off := 0; off == 0 || off < len(data); off += restPart {
		part := data[off:min(off+restPart, len(data))]
		in := map[string]any{"session": session, "path": path, "encoding": "base64", "content": base64.StdEncoding.EncodeToString(part), "append": off > 0}
		if err := c.post(ctx, "write_file", in, nil); err != nil {
			return err
		}
	}
	return nil
}

// readFile reads a whole file as a REST client must: by parts, base64.
func (c *restClient) readFile(ctx context.Context, session, path string) ([]byte, error) {
	var all []byte
	for {
		var r struct {
			Encoding, Content string
			Size              int64
			Length            int64
		}
		if err := c.post(ctx, "read_file", map[string]any{"session": session, "path": path, "offset": len(all), "limit": restPart}, &r); err != nil {
			return nil, err
		}
		b := []byte(r.Content)
		if r.Encoding == "base64" {
			var err error
			if b, err = base64.StdEncoding.DecodeString(r.Content); err != nil {
				return nil, err
			}
		}
		if len(b) == 0 {
			return nil, fmt.Errorf("read_file %s at %d of %d: nothing", path, len(all), r.Size)
		}
		all = append(all, b...)
		if int64(len(all)) >= r.Size {
			return all, nil
		}
	}
}
