package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/sandbox"
)

// --box-cpu-weight reaches the sandbox's options: auto (the default) is
// the machine's weight, off and 0 leave the group's weight alone, a
// number in cpu.weight's range is taken as is; anything else is refused
// by the parser with what it takes, and the refused value changes
// nothing.
func TestBoxCPUWeightFlag(t *testing.T) {
	parse := func(args ...string) (int, error) {
		f := &serveFlags{}
		cmd := &cobra.Command{Use: "serve"}
		f.register(cmd)
		if err := cmd.ParseFlags(args); err != nil {
			return f.boxCPUWeight, err
		}
		return f.appOptions(&globals{}, nil).Sandbox.BoxCPUWeight, nil
	}
	machine := sandbox.MachineBoxCPUWeight()
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, machine},
		{[]string{"--box-cpu-weight=auto"}, machine},
		{[]string{"--box-cpu-weight", "AUTO"}, machine},
		{[]string{"--box-cpu-weight=off"}, 0},
		{[]string{"--box-cpu-weight=0"}, 0},
		{[]string{"--box-cpu-weight=1"}, 1},
		{[]string{"--box-cpu-weight", "800"}, 800},
		{[]string{"--box-cpu-weight=10000"}, 10000},
	} {
		got, err := parse(c.args...)
		if err != nil || got != c.want {
			t.Errorf("%q: weight %d, %v; want %d", c.args, got, err, c.want)
		}
	}
	for _, bad := range []string{"-1", "10001", "1e3", "1.5", "two", "", "0x10", "99999999999999999999"} {
		got, err := parse("--box-cpu-weight=" + bad)
		if err == nil || !strings.Contains(err.Error(), "box-cpu-weight") || !strings.Contains(err.Error(), "10000") {
			t.Errorf("%q: %v; want a refusal that names the flag and its range", bad, err)
		}
		if got != machine {
			t.Errorf("%q refused, but the weight became %d (want the default %d)", bad, got, machine)
		}
	}
}

// quro doctor says the boxes' CPU weight in effect, on both scales where
// the cpu controller is v1's, and how to set it; doctor itself writes
// none (it is not the server).
func TestDoctorShowsTheBoxCPUWeight(t *testing.T) {
	t.Setenv("QURO_URL", "")
	t.Setenv("QURO_TOKEN", "")
	out, errs, code := quro(t, "", "--data", t.TempDir(), "doctor")
	if code != 0 {
		t.Fatalf("doctor: exit %d: %s", code, errs)
	}
	var row string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "cpu weight") {
			row = line
		}
	}
	if row == "" {
		t.Fatalf("no cpu weight row:\n%s", out)
	}
	if strings.Contains(row, "no cpu controller") {
		t.Skipf("no cpu controller here: %s", row)
	}
	if !strings.Contains(row, "cpu.weight ") || !strings.Contains(row, "busy host threads") || !strings.Contains(row, "--box-cpu-weight") {
		t.Fatalf("the cpu weight row says neither the weight nor how to set it: %s", row)
	}
}
