package sandbox

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestRuntimeEtcOnlyWhatRuntimesRead: a host-userland box shows the
// language runtimes' configuration files they read (the JDK's
// java.security and jvm.cfg, PHP's cli php.ini), not the rest of their
// /etc directories: the JDK's management/ (JMX access and password files)
// and jfr/ are absent.
func TestRuntimeEtcOnlyWhatRuntimesRead(t *testing.T) {
	hidden, _ := filepath.Glob("/etc/java-*/management/jmxremote.access")
	shown, _ := filepath.Glob("/etc/java-*/security/java.security")
	if len(hidden) == 0 || len(shown) == 0 {
		t.Skip("no JDK configuration in /etc here")
	}
	sb := newSandbox(t)
	if !sb.Boxed() {
		t.Skip("no bubblewrap box")
	}
	jfr, _ := filepath.Glob("/etc/java-*/jfr")
	hidden = append(hidden, jfr...)
	conf, _ := filepath.Glob("/usr/lib/jvm/java-*/conf/security/java.security") // links into /etc/java-*
	cfg, _ := filepath.Glob("/usr/lib/jvm/java-*/lib/jvm.cfg")
	want := append(append(shown, conf...), cfg...)
	if php, _ := filepath.Glob("/etc/php/*/cli/php.ini"); len(php) > 0 {
		want = append(want, php...)
	}
	var script strings.Builder
	for _, f := range hidden {
		script.WriteString("if [ -e '" + f + "' ]; then echo 'SHOWN " + f + "'; fi\n")
	}
	for _, f := range want {
		script.WriteString("head -c1 '" + f + "' >/dev/null || echo 'MISSING " + f + "'\n")
	}
	out, errOut, exit := run(t, sb, testCtx(t), script.String(), nil)
	if exit.Code != 0 || out != "" {
		t.Fatalf("exit %d\n%s%s", exit.Code, out, errOut)
	}
}
