"""Drives a Jupyter kernel (Debian's python3-ipykernel) with jupyter_client
for bench/pyrt: warm print(1) execute round trips and interrupt latency.

Usage: python3 jupyter_helper.py N_WARM N_INTERRUPT
Prints one JSON object on stdout: lists of durations in microseconds.
"""

import json
import sys
import time

from jupyter_client.manager import start_new_kernel


def wait_reply(kc, msg_id):
    while True:
        m = kc.get_shell_msg(timeout=60)
        if m["parent_header"].get("msg_id") == msg_id:
            return m


def wait_idle(kc, msg_id, want_text=None):
    """Reads iopub until the request's status is idle; returns when the
    stream text (if any) was seen too."""
    seen = want_text is None
    while True:
        m = kc.get_iopub_msg(timeout=60)
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        t = m["msg_type"]
        if t == "stream" and want_text is not None and want_text in m["content"].get("text", ""):
            seen = True
        if t == "status" and m["content"]["execution_state"] == "idle" and seen:
            return


def main():
    n_warm, n_int = int(sys.argv[1]), int(sys.argv[2])
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        for _ in range(20):  # warm up
            mid = kc.execute("print(1)")
            wait_reply(kc, mid)
            wait_idle(kc, mid, "1")
        reply_us, full_us = [], []
        for _ in range(n_warm):
            t0 = time.perf_counter()
            mid = kc.execute("print(1)")
            r = wait_reply(kc, mid)
            t1 = time.perf_counter()
            wait_idle(kc, mid, "1")
            t2 = time.perf_counter()
            assert r["content"]["status"] == "ok", r["content"]
            reply_us.append((t1 - t0) * 1e6)
            full_us.append((t2 - t0) * 1e6)
        int_us = []
        for _ in range(n_int):
            mid = kc.execute("import time\nprint('go', flush=True)\ntime.sleep(3600)")
            while True:  # wait until the code runs
                m = kc.get_iopub_msg(timeout=60)
                if (m["parent_header"].get("msg_id") == mid and m["msg_type"] == "stream"
                        and "go" in m["content"].get("text", "")):
                    break
            t0 = time.perf_counter()
            km.interrupt_kernel()
            r = wait_reply(kc, mid)
            t1 = time.perf_counter()
            assert r["content"].get("ename") == "KeyboardInterrupt", r["content"]
            int_us.append((t1 - t0) * 1e6)
            wait_idle(kc, mid)
        json.dump({"execute_reply_us": reply_us, "execute_output_idle_us": full_us,
                   "interrupt_us": int_us,
                   "python": sys.version.split()[0]}, sys.stdout)
        sys.stdout.write("\n")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
