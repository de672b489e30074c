package runcode

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCaptureKeepsSmallStreamsWhole(t *testing.T) {
	c := NewCapture(100, filepath.Join(t.TempDir(), "out"), 1<<20)
	c.Write([]byte("hello "))
	c.Write([]byte("world"))
	v := c.Finish()
	if v.Text != "hello world" || v.Cut || v.Escaped || v.File != "" || v.Bytes != 11 {
		t.Fatalf("%+v", v)
	}
}

func TestCaptureCutsTheMiddleAndSpillsEverything(t *testing.T) {
	dir := t.TempDir()
	c := NewCapture(100, filepath.Join(dir, "out"), 1<<20)
	var all bytes.Buffer
	for i := 0; i < 1000; i++ {
		line := []byte(strings.Repeat(string(rune('a'+i%26)), 9) + "\n")
		all.Write(line)
		c.Write(line)
	}
	v := c.Finish()
	if !v.Cut || v.Bytes != int64(all.Len()) {
		t.Fatalf("%+v", v)
	}
	if !strings.HasPrefix(v.Text, all.String()[:50]) || !strings.HasSuffix(v.Text, all.String()[all.Len()-50:]) {
		t.Errorf("head or tail lost:\n%s", v.Text)
	}
	if !strings.Contains(v.Text, "cut from the middle") {
		t.Errorf("no cut notice:\n%s", v.Text)
	}
	got, err := os.ReadFile(v.File)
	if err != nil || !bytes.Equal(got, all.Bytes()) {
		t.Errorf("spill file differs from the stream (%v)", err)
	}
}

func TestCaptureSpillLimit(t *testing.T) {
	c := NewCapture(64, filepath.Join(t.TempDir(), "out"), 1000)
	c.Write(bytes.Repeat([]byte("x"), 5000))
	v := c.Finish()
	if v.FileBytes != 1000 || v.Bytes != 5000 {
		t.Fatalf("%+v", v)
	}
	if fi, err := os.Stat(v.File); err != nil || fi.Size() != 1000 {
		t.Fatalf("spill file: %v %v", fi, err)
	}
}

func TestCaptureEscapesInvalidUTF8AndNULAndKeepsTheRawBytes(t *testing.T) {
	raw := []byte("ok \xff\xfe and \x00 end é")
	c := NewCapture(1000, filepath.Join(t.TempDir(), "out"), 1<<20)
	c.Write(raw)
	v := c.Finish()
	if v.Text != `ok \xff\xfe and \x00 end é` || !v.Escaped {
		t.Fatalf("%+v", v)
	}
	got, err := os.ReadFile(v.File)
	if err != nil || !bytes.Equal(got, raw) {
		t.Fatalf("raw bytes not kept: %q %v", got, err)
	}
}

func TestCaptureNeverSplitsARune(t *testing.T) {
	for limit := 64; limit < 80; limit++ {
		c := NewCapture(limit, "", 0)
		c.Write([]byte(strings.Repeat("é€😀", 200)))
		v := c.Finish()
		if !utf8.ValidString(v.Text) || v.Escaped {
			t.Fatalf("limit %d: text not clean UTF-8: %q", limit, v.Text)
		}
	}
}

func TestCaptureManySmallWritesEqualOneBigWrite(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdefghij\n"), 500)
	one := NewCapture(200, "", 0)
	one.Write(data)
	many := NewCapture(200, "", 0)
	for i := 0; i < len(data); i += 7 {
		many.Write(data[i:min(i+7, len(data))])
	}
	if a, b := one.Finish(), many.Finish(); a.Text != b.Text {
		t.Fatalf("chunking changed the view:\n%q\n%q", a.Text, b.Text)
	}
}

func FuzzCapture(f *testing.F) {
	f.Add([]byte("hello"), 70, 3)
	f.Add(bytes.Repeat([]byte("\xe2\x82\xac"), 100), 64, 5)
	f.Add([]byte("\x00\xff abc"), 64, 1)
	f.Add(bytes.Repeat([]byte("x"), 500), 64, 500)
	f.Fuzz(func(t *testing.T, data []byte, limit, chunk int) {
		if limit < 64 || limit > 4096 || chunk < 1 {
			return
		}
		dir := t.TempDir()
		c := NewCapture(limit, filepath.Join(dir, "out"), 1<<30)
		for i := 0; i < len(data); i += chunk {
			c.Write(data[i:min(i+chunk, len(data))])
		}
		v := c.Finish()
		if !utf8.ValidString(v.Text) {
			t.Fatal("text is not valid UTF-8")
		}
		if v.Bytes != int64(len(data)) {
			t.Fatalf("Bytes %d, want %d", v.Bytes, len(data))
		}
		if !v.Cut {
			want, _ := escapeBytes(data)
			if v.Text != want {
				t.Fatalf("uncut text %q, want %q", v.Text, want)
			}
		}
		if v.File != "" {
			got, err := os.ReadFile(v.File)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("spill file differs (%v)", err)
			}
		} else if v.Cut || v.Escaped {
			t.Fatal("cut or escaped stream without a spill file")
		}
	})
}

func TestCaptureSpillRefusesASymlinkOutOfTheRoot(t *testing.T) {
	ws := t.TempDir()
	outside := t.TempDir()
	// the session's code replaces .quro with a link to a host directory
	if err := os.Symlink(outside, filepath.Join(ws, ".quro")); err != nil {
		t.Fatal(err)
	}
	c := NewCapture(64, filepath.Join(ws, ".quro/outputs/x.stdout"), 1<<20).Within(ws)
	c.Write(bytes.Repeat([]byte("y"), 1000))
	v := c.Finish()
	if v.File != "" || v.FileError == "" {
		t.Fatalf("spilled through the link: %+v", v)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("wrote outside the workspace: %v", entries)
	}
	// a link planted at the file itself is refused too
	os.Remove(filepath.Join(ws, ".quro"))
	os.MkdirAll(filepath.Join(ws, ".quro/outputs"), 0o755)
	target := filepath.Join(outside, "victim")
	os.WriteFile(target, []byte("keep"), 0o644)
	os.Symlink(target, filepath.Join(ws, ".quro/outputs/y.stdout"))
	c = NewCapture(64, filepath.Join(ws, ".quro/outputs/y.stdout"), 1<<20).Within(ws)
	c.Write(bytes.Repeat([]byte("z"), 1000))
	c.Finish()
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatalf("host file overwritten: %q", b)
	}
}
