package toolchain

import "regexp"

// Tool is how one run_code language is built and run with a toolchain of
// the session's userland.
//
// Arguments are templates: {prog} is the compiler or interpreter found in
// the userland, {runner} the second program (Runner: java, mono), {file}
// the source file's name, {class} the class to start (Java, Scala), {dir}
// the absolute build directory in the box, {src} the source file's
// absolute path there. Compile runs in the build directory being made,
// with the source written there as {file}, so that diagnostics name
// {file} and its line N is line N of the submitted code (nothing is
// wrapped around it).
type Tool struct {
	Lang    string
	Aliases []string
	// Prog is the program looked up in the userland's PATH; Alts are
	// further names, or absolute paths under /usr, tried after it.
	Prog string
	Alts []string
	// Requires is a file (a glob, as the box sees it) the toolchain needs
	// besides Prog, named RequiresName in the error when missing: gcc
	// compiles Objective-C only with gobjc's cc1obj.
	Requires, RequiresName string
	// Runner is a second program the run needs (java for Java's class
	// files, mono for C#'s exe), looked up the same way.
	Runner string
	// File is the source file's name; Class, when set, derives the file
	// name and the class to start from the source (Java's public class).
	File  string
	Class func(src string) (file, class string)
	// Compile is the compile command; nil for an interpreted language,
	// whose "build" only keeps the source in the cache.
	Compile []string
	Run     []string
	// Version is the arguments after {prog} that print its version.
	Version []string
	// Package is the Debian 12 packages that add the toolchain (with what
	// install_packages' --no-install-recommends leaves out, as gcc's
	// libc6-dev), or "" when Debian 12 has none (Missing then says where
	// to get it).
	Package string
	Missing string
	// Env are variables the toolchain needs, {tmp} being the session's
	// tmp directory; a variable the session sets itself wins.
	Env map[string]string
}

// Compiled reports whether the language has a compile stage.
func (t *Tool) Compiled() bool { return t.Compile != nil }

var (
	javaPublic = regexp.MustCompile(`(?m)^\s*public\s+(?:(?:final|abstract|strictfp)\s+)*class\s+([A-Za-z_$][A-Za-z0-9_$]*)`)
	javaClass  = regexp.MustCompile(`(?m)^\s*(?:(?:final|abstract|strictfp)\s+)*class\s+([A-Za-z_$][A-Za-z0-9_$]*)`)
	scalaObj   = regexp.MustCompile(`(?m)^\s*object\s+([A-Za-z_][A-Za-z0-9_]*)`)
)

// javaNames: javac wants a public class in a file of its name; the class
// to start is that one, else the first class, else Main.
func javaNames(src string) (string, string) {
	if m := javaPublic.FindStringSubmatch(src); m != nil {
		return m[1] + ".java", m[1]
	}
	if m := javaClass.FindStringSubmatch(src); m != nil {
		return "Main.java", m[1]
	}
	return "Main.java", "Main"
}

func scalaNames(src string) (string, string) {
	if m := scalaObj.FindStringSubmatch(src); m != nil {
		return "main.scala", m[1]
	}
	return "main.scala", "Main"
}

// Tools is the one table of run_code's toolchain languages. Package names
// are Debian 12's (apt-cache policy on bookworm).
var Tools = []Tool{
	{Lang: "c", Aliases: []string{"h"}, Prog: "gcc", File: "main.c",
		Compile: []string{"{prog}", "-O2", "-o", "main", "main.c", "-lm"}, Run: []string{"{dir}/main"},
		Version: []string{"--version"}, Package: "gcc libc6-dev"},
	{Lang: "cpp", Aliases: []string{"c++", "cxx", "cc", "hpp"}, Prog: "g++", File: "main.cpp",
		Compile: []string{"{prog}", "-O2", "-o", "main", "main.cpp"}, Run: []string{"{dir}/main"},
		Version: []string{"--version"}, Package: "g++ libc6-dev"},
	{Lang: "java", Prog: "javac", Runner: "java", Class: javaNames,
		Compile: []string{"{prog}", "-d", ".", "{file}"}, Run: []string{"{runner}", "-cp", "{dir}", "{class}"},
		Version: []string{"-version"}, Package: "default-jdk-headless"},
	{Lang: "kotlin", Aliases: []string{"kt"}, Prog: "kotlinc", Runner: "java", File: "main.kt",
		Compile: []string{"{prog}", "main.kt", "-include-runtime", "-d", "main.jar"}, Run: []string{"{runner}", "-jar", "{dir}/main.jar"},
		Version: []string{"-version"}, Package: "kotlin"},
	{Lang: "go", Aliases: []string{"golang"}, Prog: "go", Alts: []string{"/usr/local/go/bin/go", "/usr/lib/go/bin/go"}, File: "main.go",
		Compile: []string{"{prog}", "build", "-o", "main", "main.go"}, Run: []string{"{dir}/main"},
		Version: []string{"version"}, Package: "golang-go",
		Env: map[string]string{"GOCACHE": "{tmp}/.cache/go-build", "GOPATH": "{tmp}/go", "GOTOOLCHAIN": "local", "GOPROXY": "off", "GOTELEMETRY": "off"}},
	{Lang: "rust", Aliases: []string{"rs"}, Prog: "rustc", File: "main.rs",
		Compile: []string{"{prog}", "-o", "main", "main.rs"}, Run: []string{"{dir}/main"},
		Version: []string{"--version"}, Package: "rustc",
		Env: map[string]string{"CARGO_HOME": "{tmp}/.cargo"}},
	{Lang: "csharp", Aliases: []string{"cs", "c#"}, Prog: "mcs", Runner: "mono", File: "main.cs",
		Compile: []string{"{prog}", "-out:main.exe", "main.cs"}, Run: []string{"{runner}", "{dir}/main.exe"},
		Version: []string{"--version"}, Package: "mono-mcs"},
	{Lang: "swift", Prog: "swiftc", File: "main.swift",
		Compile: []string{"{prog}", "-o", "main", "main.swift"}, Run: []string{"{dir}/main"},
		Version: []string{"--version"}, Missing: "Swift is not packaged in Debian 12; install a toolchain from swift.org into the rootfs"},
	{Lang: "scala", Prog: "scalac", Runner: "scala", Class: scalaNames,
		Compile: []string{"{prog}", "-d", ".", "{file}"}, Run: []string{"{runner}", "-cp", "{dir}", "{class}"},
		Version: []string{"-version"}, Package: "scala"},
	{Lang: "zig", Prog: "zig", File: "main.zig",
		Compile: []string{"{prog}", "build-exe", "main.zig", "-femit-bin=main"}, Run: []string{"{dir}/main"},
		Version: []string{"version"}, Missing: "Zig is not packaged in Debian 12; install a release from ziglang.org into the rootfs"},
	{Lang: "haskell", Aliases: []string{"hs"}, Prog: "ghc", File: "main.hs",
		Compile: []string{"{prog}", "-O0", "-o", "main", "main.hs"}, Run: []string{"{dir}/main"},
		Version: []string{"--version"}, Package: "ghc"},
	{Lang: "dart", Prog: "dart", File: "main.dart",
		Run:     []string{"{prog}", "run", "{src}"},
		Version: []string{"--version"}, Missing: "Dart is not packaged in Debian 12; install the SDK from dart.dev into the rootfs"},
	{Lang: "objc", Aliases: []string{"objective-c"}, Prog: "gcc", File: "main.m",
		Requires: "/usr/lib/gcc/*/*/cc1obj", RequiresName: "cc1obj (gcc's Objective-C compiler)",
		Compile: []string{"{prog}", "-O2", "-o", "main", "main.m", "-lobjc"}, Run: []string{"{dir}/main"},
		Version: []string{"--version"}, Package: "gobjc"},
	{Lang: "fortran", Aliases: []string{"f90"}, Prog: "gfortran", File: "main.f90",
		Compile: []string{"{prog}", "-O2", "-o", "main", "main.f90"}, Run: []string{"{dir}/main"},
		Version: []string{"--version"}, Package: "gfortran"},
	{Lang: "pascal", Prog: "fpc", File: "main.pas",
		Compile: []string{"{prog}", "-v0ew", "-omain", "main.pas"}, Run: []string{"{dir}/main"},
		Version: []string{"-iW"}, Package: "fp-compiler"},
	{Lang: "ruby", Aliases: []string{"rb"}, Prog: "ruby", File: "main.rb",
		Run: []string{"{prog}", "{src}"}, Version: []string{"--version"}, Package: "ruby"},
	{Lang: "php", Prog: "php", File: "main.php",
		Run: []string{"{prog}", "{src}"}, Version: []string{"--version"}, Package: "php-cli"},
	{Lang: "perl", Aliases: []string{"pl"}, Prog: "perl", File: "main.pl",
		Run: []string{"{prog}", "{src}"}, Version: []string{"-e", `print "perl $^V\n"`}, Package: "perl"},
	{Lang: "lua", Prog: "lua5.4", Alts: []string{"lua", "lua5.3"}, File: "main.lua",
		Run: []string{"{prog}", "{src}"}, Version: []string{"-v"}, Package: "lua5.4"},
	{Lang: "r", Aliases: []string{"rscript"}, Prog: "Rscript", File: "main.R",
		Run: []string{"{prog}", "{src}"}, Version: []string{"--version"}, Package: "r-base-core"},
	{Lang: "julia", Aliases: []string{"jl"}, Prog: "julia", File: "main.jl",
		Run: []string{"{prog}", "{src}"}, Version: []string{"--version"},
		Missing: "Julia is not packaged in Debian 12; install a release from julialang.org into the rootfs"},
}
