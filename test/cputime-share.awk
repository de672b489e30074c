# test/cputime.sh's PER_TEST=share: reads go test's events (test2json),
# each line led by the test process's cgroup CPU counter (ns) as the
# event arrived, and shares the CPU spent between two events evenly
# among the tests running then: a test or subtest started or continued,
# not paused, with no subtest of its own running or waiting (a parent
# waiting on its parallel subtests takes none). Prints, per top-level
# test: CPU seconds, go test's elapsed seconds, its result, pkg, test.
{
	u = $1
	a = field("Action")
	t = field("Test")
	spread(u - last)
	last = u
	if (t == "")
		next
	if (a == "run" || a == "cont")
		st[t] = "R"
	else if (a == "pause")
		st[t] = "P"
	else if (a == "pass" || a == "fail" || a == "skip") {
		delete st[t]
		if (index(t, "/") == 0) {
			res[t] = a
			el[t] = number("Elapsed")
		}
	}
}

# field returns the string value of key in the event, "" without it.
function field(key) {
	if (!match($0, "\"" key "\":\"([^\"\\\\]|\\\\.)*\""))
		return ""
	return substr($0, RSTART + length(key) + 4, RLENGTH - length(key) - 5)
}

# number returns the numeric value of key in the event, 0 without it
# (test2json leaves out an elapsed time of 0.00s).
function number(key) {
	if (!match($0, "\"" key "\":[0-9.]+"))
		return 0
	return substr($0, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
}

# spread shares d ns among the running leaves, by their top-level test.
function spread(d,    n, t, o, leaf, k, top) {
	n = 0
	for (t in st) {
		if (st[t] != "R")
			continue
		leaf = 1
		for (o in st)
			if (index(o, t "/") == 1) {
				leaf = 0
				break
			}
		if (leaf)
			L[++n] = t
	}
	if (n == 0) {
		cpu["(between tests)"] += d
		return
	}
	for (k = 1; k <= n; k++) {
		top = L[k]
		sub(/\/.*/, "", top)
		cpu[top] += d / n
	}
}

END {
	for (t in cpu)
		printf "%.1f\t%s\t%s\t%s\t%s\n", cpu[t] / 1e9, (t in el) ? el[t] : "-", (t in res) ? res[t] : "-", pkg, t
}
