#!/bin/bash
# ab.sh BEFORE AFTER [N]: REST start_process and terminal_exec of `true`,
# N rounds (default 60), alternating call by call between two `quro serve`
# (two builds) running side by side on fresh data directories, so that both
# see the same load; each prints the median and minimum of its calls after
# the first five (see bench/README.md, "commands.run and start_process").
# Needs curl and python3; runs as root like the other benches.
set -eu
before=$1 after=$2 n=${3:-60}
tmp=$(mktemp -d /tmp/quro-bench-ab-XXXXXX)
trap 'kill $(cat $tmp/*.pid 2>/dev/null) 2>/dev/null; wait 2>/dev/null; rm -rf $tmp' EXIT
start() { # name binary
	mkdir -p $tmp/$1
	: >$tmp/$1.out
	"$2" serve --addr 127.0.0.1:0 --data $tmp/$1 >$tmp/$1.out 2>/dev/null &
	echo $! >$tmp/$1.pid
	until grep -q "listening on" $tmp/$1.out; do sleep 0.5; done
	grep -o 'http://[0-9.:]*' $tmp/$1.out | tail -1 >$tmp/$1.url
	"$2" token create --data $tmp/$1 --tenant bench --scopes read,exec 2>/dev/null | head -1 >$tmp/$1.tok
}
start before "$before"
start after "$after"
for v in before after; do
	u=$(cat $tmp/$v.url) t=$(cat $tmp/$v.tok)
	# the embedded Python prepared (a fresh data directory's first minute)
	until curl -s -H "Authorization: Bearer $t" -d '{"code":"print(1)"}' $u/v1/run_code | grep -q '"exit_code":0'; do sleep 2; done
	curl -s -H "Authorization: Bearer $t" -d '{"network":"internet"}' $u/v1/create_session |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' >$tmp/$v.sid
done
for i in $(seq $n); do
	for v in before after; do
		u=$(cat $tmp/$v.url) t=$(cat $tmp/$v.tok) s=$(cat $tmp/$v.sid)
		for c in start_process terminal_exec; do
			curl -s -o /dev/null -w "$v $c %{time_total}\n" -H "Authorization: Bearer $t" \
				-d "{\"session\":\"$s\",\"command\":\"true\"}" $u/v1/$c
		done
	done
done >$tmp/times
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - $tmp/times <<'P'
import collections, statistics, sys
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    v, c, s = l.split()
    d[(c, v)].append(float(s) * 1000)
for (c, v), xs in sorted(d.items()):
    xs = xs[5:]
    print(f"{c:14} {v:7} n={len(xs)} median {statistics.median(xs):7.1f} ms  min {min(xs):6.1f} ms")
P
