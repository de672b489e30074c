"""Quro's resident Python worker: one per session, driven by the Go side.
It runs on the embedded CPython 3.14 (with -I -S) and on a rootfs's python3
(Debian 12: 3.11, with -E and site as usual): nothing here may need more
than 3.11.

Protocol: requests arrive on fd 3, replies leave on fd 4, each a frame of a
4-byte big-endian length and a JSON object. A request's JSON may be followed
by a newline and a raw payload (a run's code, as bytes: no base64). Nothing user code prints can
reach these pipes. fd 1 and fd 2 are pipes read by the Go side; at the end of
a run the worker flushes every layer (Python streams, C stdio), writes the
run's sync token to both, and only then sends the reply, so the Go side
knows where each stream's part of the run ends.

Requests:
  {"op": "bind", "cwd": DIR, "env": {...}}   adopt a session's directory and
                                             variables (a pre-warmed spare)
  {"op": "run", "id": N, "token": T, "env": {...}?} \n CODE-BYTES
  R<N> <T> \n CODE-BYTES                    a run that keeps the variables
                                             (the common case, without JSON)
  A run's JSON may also carry, for a code context (E2B's code interpreter),
  "cx": true (the reply then has the count and results) and:
    "ctx": ID      run in context ID: a namespace, working directory and
                   execution count of its own, made on first use ("cwd":
                   its directory; "ws": the workspace, where /home/user/...
                   goes when the box has no /home/user)
    "rich": true   the last expression's value and display() calls become
                   results (mime bundles), an exception a structured error
                   (not a traceback on stderr)
    "renv": {...}  variables set for this run only, restored after it
  {"op": "drop", "ctx": ID}                 forget context ID
Replies:
  {"op": "hello", "pid": PID, "version": "3.14.6"}
  {"op": "bound"}
  {"op": "done", "id": N, "status": "ok"|"error"|"interrupted"|"exit",
   "exit_code": INT, "artifacts": [...], "killed": [...], "notes": [...],
   "results": [{"main": BOOL, "data": {MIME: ...}}]?, "exc": {"name",
   "value", "traceback"}?, "count": N?}      (the last three: context runs)
  {"op": "dropped"}
  {"op": "stopped", "id": N}   before "done": the code of an interrupted run
                               has stopped (the interrupt's grace ends)

A timeout reaches the worker as SIGINT; the handler raises KeyboardInterrupt
only while user code runs, so the worker's own bookkeeping is never cut.

Output. sys.stdout is buffered (its text layer keeps up to 64 KiB; a write
through sys.stdout.buffer sends that text first, so the order holds): a loop
of prints costs what it costs into any pipe, not a system call per print.
sys.stderr is line-buffered, as CPython's own (so a print to it is one write,
its text and its end together, not two), and flushes stdout before each
write, so the order of the two streams' lines is the order of the code's
calls (a part of a line written to stderr waits for its end or a flush, and
stdout written meanwhile may go first). Both are flushed:
  - by a thread, every flush interval (20 ms) while a run is in progress,
    so a line printed by running or blocked code reaches the Go side within
    the interval (a run shorter than the interval does not wake the thread
    where it waits on a timerfd the run arms, 3.13 and later: no GIL handed
    over for a short run; the thread is parked between runs, when stdout is
    line-buffered instead: output of a thread left running goes out as it
    comes);
  - at the end of a run, before the sync tokens and the reply;
  - before input() (and its prompt), a KeyboardInterrupt, a traceback or any
    write to stderr, os.write() to fd 1 or 2, os._exit() and os.abort();
  - before what hands the descriptors to other code or may block, seen
    through an audit hook: time.sleep, os.system, subprocess, posix_spawn,
    exec, fork, kill, ctypes calls (C code writes fd 1 itself; Python 3.11
    has no event for a call: the look-up of a C function stands in).
What is lost when the process dies at once (SIGKILL from outside, a
segfault in C code) is at most the last flush interval of stdout.
"""

# Imports are few and cheap: a worker started for a session (no spare)
# pays them before its first run. traceback, tempfile, asyncio and ctypes
# proper are imported when needed; C modules stand in for ast, signal,
# ctypes and json.
import _ast
import _ctypes
import _signal
import _thread
import binascii
import builtins
import io
import linecache
import os
import sys
try:
    import _json as _cjson
except ImportError:  # a python3 built without it (a rootfs's): json's own code
    _cjson = None

REQ_FD = 3
REP_FD = 4
PR_SET_CHILD_SUBREAPER = 36

_pid = os.getpid()
_running = False
_interrupted = False
_in_run = False   # a run request is being handled
_in_child = False
_counter = 0
_artifacts = []
_session_env_keys = set()
_libc = None
_loop = None
_saved_out = -1
_saved_err = -1
_saved_ids = {}
_task_fd = -1
_children_fd = -1
_orig_stdin = None
_orig_input = builtins.input
_main = None
# Code contexts: id -> [module, cwd, execution count]; the default
# namespace (_main) counts in _default_count.
_ctxs = {}
_default_count = 0
_rich_mode = False  # the run in progress is a rich one
_results = []       # its results (mime bundles)

# Output (see the module's doc).
_OUT_BUFFER = 64 << 10
_out = None           # the worker's sys.stdout (buffered)
_err = None           # the worker's sys.stderr (line-buffered)
_flush_interval = 0.02
_flusher = False      # the flush thread runs
_live = False         # a run's output phase: the flush thread ticks
_gate = _thread.allocate_lock()  # held while no run is in progress
_wake = _thread.allocate_lock()  # released to make the flush thread flush now
# The flush thread's clock where the os module has timerfd (3.13 and
# later): a run arms it and the thread wakes only when a flush interval of
# the run has passed, so a run shorter than that never wakes the thread
# (nor hands it the GIL). -1: the gate and _wake above instead.
_tick_fd = -1
_tick_id = None       # (st_dev, st_ino) of _tick_fd, checked before a read
_ticking = False      # the run in progress armed _tick_fd
_raw_lock = _thread.RLock()      # one writer of a raw stream at a time
_os_write = os.write
_os_exit = os._exit
_os_abort = os.abort
_os_fork = os.fork
_os_forkpty = getattr(os, "forkpty", None)


# JSON through the C codec alone (_json): the json package imports re and
# compiles its patterns, 1.2 MiB of a worker's memory for as long as it
# lives (3.14: 3.3 -> 4.5 MiB anonymous), and every worker reads a JSON
# request.
# The C scanner and encoder are json.loads and json.dumps without that
# (same values, same errors inside a document: the C code raises
# json.decoder's JSONDecodeError, importing it then).
class _JSONContext:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_scan_json = _cjson.make_scanner(_JSONContext()) if _cjson else None
_JSON_WS = " \t\n\r"


def _loads(s):
    """json.loads of a document (str, or UTF-8 bytes)."""
    if not isinstance(s, str):
        s = bytes(s).decode("utf-8")
    if _scan_json is None:
        import json
        return json.loads(s)
    i = len(s) - len(s.lstrip(_JSON_WS))
    try:
        obj, end = _scan_json(s, i)
    except StopIteration as e:
        raise ValueError("Expecting value (char %d)" % e.value) from None
    rest = s[end:].lstrip(_JSON_WS)
    if rest:
        raise ValueError("Extra data (char %d)" % (len(s) - len(rest)))
    return obj


def _not_json(o):
    raise TypeError("Object of type %s is not JSON serializable" % type(o).__name__)


def _dumps(obj):
    """json.dumps(obj) with its defaults (ASCII, ", " and ": ", NaN
    allowed, circular references refused)."""
    if _cjson is None:
        import json
        return json.dumps(obj)
    enc = _cjson.make_encoder({}, _not_json, _cjson.encode_basestring_ascii, None, ": ", ", ", False, False, True)
    return "".join(enc(obj, 0))


# ---- protocol ---------------------------------------------------------------

_rbuf = b""


def _read_exact(n):
    """n bytes from the request pipe; reads ahead (a small frame arrives
    with its header in one read)."""
    global _rbuf
    buf = _rbuf
    if len(buf) >= n:
        _rbuf = buf[n:]
        return buf[:n]
    chunks = [buf]
    have = len(buf)
    while have < n:
        b = os.read(REQ_FD, max(n - have, 1 << 16))
        if not b:
            return None
        chunks.append(b)
        have += len(b)
    buf = b"".join(chunks)
    _rbuf = buf[n:]
    return buf[:n]


def _recv():
    head = _read_exact(4)
    if head is None:
        return None
    body = _read_exact(int.from_bytes(head, "big"))
    if body is None:
        return None
    i = body.find(b"\n")
    if i < 0:
        return _loads(body)
    if body[:1] == b"R":
        rid, _, token = body[1:i].partition(b" ")
        return {"op": "run", "id": int(rid), "token": token.decode(), "payload": body[i + 1:]}
    msg = _loads(body[:i])
    msg["payload"] = body[i + 1:]
    return msg


def _send(obj):
    if obj.get("op") == "done" and not (obj["artifacts"] or obj["killed"] or obj["notes"] or "count" in obj):
        # The common reply, without the JSON encoder.
        body = b'{"op":"done","id":%d,"status":"%s","exit_code":%d}' % (
            obj["id"], obj["status"].encode(), obj["exit_code"])
    elif obj.get("op") == "hello":
        body = b'{"op":"hello","pid":%d,"version":"%s"}' % (obj["pid"], obj["version"].encode())
    elif obj.get("op") == "stopped":
        body = b'{"op":"stopped","id":%d}' % obj["id"]
    else:
        body = _dumps(obj).encode()
    data = memoryview(len(body).to_bytes(4, "big") + body)
    while data:
        n = _os_write(REP_FD, data)
        data = data[n:]


def _write_all(fd, b):
    data = memoryview(b)
    while data:
        try:
            n = _os_write(fd, data)
        except InterruptedError:
            continue
        data = data[n:]


# ---- set-up -----------------------------------------------------------------

def _on_sigint(signum, frame):
    global _interrupted
    if _running:
        _interrupted = True
        # Code that swallows the KeyboardInterrupt may be killed after the
        # grace: what it printed goes out now.
        _flush_out()
        raise KeyboardInterrupt
    # Before the code starts (its request read, being compiled) or between
    # runs: ignored. The server repeats a run's SIGINT until the run ends,
    # so one that lands early is sent again once the code runs; and a
    # boxed worker's signal goes through the box's init, which may deliver
    # one sent for the run before after the next run's request is read —
    # kept for later, it would interrupt a run nobody interrupted.


def _after_fork_in_child():
    # A fork of user code must never speak the protocol.
    global _in_child, _tick_fd
    _in_child = True
    for fd in (REQ_FD, REP_FD, _tick_fd):
        try:
            if fd >= 0:
                os.close(fd)
        except OSError:
            pass
    _tick_fd = -1
    # The flush thread is not forked: the child's stdout goes out by line.
    try:
        _out.reconfigure(line_buffering=True)
    except Exception:
        pass


# ---- output -----------------------------------------------------------------

def _write_raw(f, b):
    """All of b to the raw file f (a pipe may take a part), one writer at a
    time: a pipe does not keep a write of more than 4 KiB whole when it has
    to wait for room, so two threads' flushes could splice into each other.
    (Reentrant: a signal handler's flush in the writing thread.)"""
    m = memoryview(b).cast("B")
    total = len(m)
    with _raw_lock:
        while m:
            n = io.FileIO.write(f, m)
            if n is None:  # made non-blocking by the code, and full
                return total - len(m)
            m = m[n:]
    return total


class _OutRaw(io.FileIO):
    """fd 1 under sys.stdout's text layer, which keeps up to _OUT_BUFFER
    bytes of text and then writes them here. A direct write (through
    sys.stdout.buffer) sends the text kept first, so the order holds. (The
    text layer takes its text out before it writes it here: the nested flush
    finds nothing.)"""

    def write(self, b):
        _flush_out(False)
        return _write_raw(self, b)


class _ErrRaw(io.FileIO):
    """fd 2 under sys.stderr's line-buffered text layer; stdout's text goes
    out first, so the two streams keep the order of the calls that wrote
    their lines."""

    def write(self, b):
        _flush_out(False)
        return _write_raw(self, b)


def _make_out():
    raw = _OutRaw(1, "w", closefd=False)
    raw.name = "<stdout>"
    # Not write_through: the text layer's own buffer is what makes a print
    # cheap (a write-through layer costs a call into the layer below per
    # print, ~3x the CPU of the loop).
    t = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape")
    t._CHUNK_SIZE = _OUT_BUFFER
    return t


def _make_err():
    raw = _ErrRaw(2, "w", closefd=False)
    raw.name = "<stderr>"
    # Line-buffered as CPython's stderr: print() writes its text and then
    # its end, and a reader of the pipe would see two chunks (E2B's
    # onStderr called twice for one print).
    return io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", line_buffering=True)


def _flush_out(err=True):
    """Flushes the worker's stdout, then (err) what stderr keeps of a line
    not ended yet; never raises (it may run in a signal handler or an audit
    hook, in the middle of a write). The raw lock is held from before the
    text layer hands its text out until it is written: a flush that took
    text first writes it first (the flush thread, taking a chunk, could
    otherwise be overtaken by the main thread's next chunk or by the run's
    sync token). The raw streams' own writes flush stdout only: stderr's
    part of a line, written later than some of the text they carry, goes
    after it."""
    o = _out
    if o is None:
        return
    try:
        with _raw_lock:
            o.flush()
            if err and _err is not None:
                _err.flush()
    except Exception:
        pass


# Audit events before which stdout is flushed: other code (a child process,
# C code) gets the descriptors, or the code may block for long.
_FLUSH_EVENTS = frozenset((
    "time.sleep", "os.system", "subprocess.Popen", "os.posix_spawn", "os.exec",
    "os.fork", "os.forkpty", "os.kill", "os.killpg", "signal.pthread_kill",
    "ctypes.call_function",
    # Python 3.11 raises no ctypes.call_function for a foreign function's
    # call; the look-up of the function (its first use through a library
    # object) stands in for it.
    "ctypes.dlsym",
))


def _audit(event, args):
    if event in _FLUSH_EVENTS:
        _flush_out()


def _write(fd, data, /):
    if fd == 1 or fd == 2:
        _flush_out()
    return _os_write(fd, data)


def _exit(n, /):
    _flush_all()
    _os_exit(n)


def _abort():
    _flush_all()
    _os_abort()


def _flush_all():
    _flush_out()
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass
    if _libc is not None:
        try:
            _libc.fflush(None)
        except BaseException:
            pass


def _fork_quietly(fork):
    """os.fork and os.forkpty warn (DeprecationWarning) that a process with
    threads forks. The flush thread is the worker's, not the code's, and
    holds no lock at a fork (the at-fork hook flushes first), so the warning
    is dropped when it is the only other thread, and otherwise given again
    as the code's (called from this wrapper, it would count as the
    worker's, which Python's default filters do not show)."""
    def f():
        _flush_out()
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = fork()
        if caught:
            own = False
            if _task_fd >= 0 and _flusher:
                try:
                    own = os.fstat(_task_fd).st_nlink == 4
                except OSError:
                    pass
            for w in caught:
                if own and issubclass(w.category, DeprecationWarning) and "multi-threaded" in str(w.message):
                    continue
                warnings.warn(w.message, w.category, stacklevel=2)
        return r
    f.__name__ = fork.__name__
    f.__qualname__ = fork.__qualname__
    f.__doc__ = fork.__doc__
    return f


def _flush_loop():
    """The flush thread: while a run is in progress, flushes stdout every
    flush interval (or at once when woken)."""
    global _tick_fd
    while True:
        try:
            fd = _tick_fd
            if fd >= 0:
                # Only the timerfd made at set-up is read: user code may
                # have closed it and opened a file of its own under its
                # number. Then (or on an error) the gate from now on.
                try:
                    st = os.fstat(fd)
                    if (st.st_dev, st.st_ino) != _tick_id:
                        raise OSError("not the flush timer")
                    os.read(fd, 8)
                except OSError:
                    _tick_fd = -1
                    continue
                if _live:
                    _flush_out()
                continue
            _gate.acquire()
            _gate.release()
            while _live:
                _wake.acquire(True, _flush_interval)
                _flush_out()
        except BaseException:
            pass


def _output_live(on):
    """Starts (a run begins) or ends (its output is over) the flush
    thread's ticking; between runs stdout is line-buffered."""
    global _live, _ticking
    if on == _live:
        return
    _live = on
    try:
        _out.reconfigure(line_buffering=not on)
    except Exception:
        pass
    if _flusher:
        if on:
            _ticking = _arm_tick(True)
            if not _ticking:
                _gate.release()
        elif _ticking:
            _ticking = False
            _arm_tick(False)
        else:
            _gate.acquire()


def _arm_tick(on):
    """Arms (a run begins: the first tick one flush interval later, then
    every interval) or disarms the flush thread's timerfd; False when there
    is none or it is gone (user code closed it: the gate from now on)."""
    global _tick_fd
    if _tick_fd < 0:
        return False
    try:
        t = _flush_interval if on else 0
        os.timerfd_settime(_tick_fd, initial=t, interval=t)
        return True
    except (OSError, ValueError):
        _tick_fd = -1
        return False


def _input(prompt=""):
    if sys.stdin is not _orig_stdin:
        return _orig_input(prompt)  # flushes stdout itself
    if prompt:
        sys.stdout.write(str(prompt))
    _flush_all()
    raise EOFError("input() has no standard input here: run_code does not connect stdin "
                   "(put the data in the code or in a workspace file)")


class _Lib:
    """The C library for _ctypes (what ctypes.CDLL(None) is, without
    importing ctypes: ~10 ms at start-up)."""

    def __init__(self):
        self._handle = _ctypes.dlopen(None, os.RTLD_NOW)

    def __getattr__(self, name):
        class F(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL
            _restype_ = None
        f = F((name, self))
        setattr(self, name, f)
        return f


class _Ptr(_ctypes._SimpleCData):
    _type_ = "P"


def _site():
    """What the site module does for this interpreter, which runs with -S
    (site's search for site-packages, sitecustomize and usercustomize costs
    a few ms at start): the builtins exit, quit, help, copyright, credits
    and license; site itself if the tree's site-packages holds more than
    Quro's quro-pip.pth and quro-pip-box.pth (which only serve `python3 -m pip`: the %pip line
    runs pip from QURO_PIP_DIR), or a sitecustomize; and the session's user
    site (see _refresh_path), which -I/-s would leave out."""
    import _sitebuiltins
    eof = "Ctrl-D (i.e. EOF)"
    builtins.quit = _sitebuiltins.Quitter("quit", eof)
    builtins.exit = _sitebuiltins.Quitter("exit", eof)
    builtins.help = _sitebuiltins._Helper()
    builtins.copyright = _sitebuiltins._Printer("copyright", sys.copyright)
    builtins.credits = _sitebuiltins._Printer(
        "credits", "Thanks to CWI, CNRI, BeOpen, Zope Corporation, the Python Software Foundation,\n"
        "and a cast of thousands for supporting Python development.  See www.python.org for more information.")
    builtins.license = _sitebuiltins._Printer(
        "license", "See https://www.python.org/psf/license/",
        ["LICENSE.txt", "LICENSE"], [os.path.dirname(os.__file__), os.getcwd()])
    lib = os.path.dirname(os.__file__)
    try:
        extra = [n for n in os.listdir(os.path.join(lib, "site-packages"))
                 if n not in ("quro-pip.pth", "quro-pip-box.pth", "README.txt", "__pycache__")]
    except OSError:
        extra = []
    if extra or os.path.exists(os.path.join(lib, "sitecustomize.py")):
        import site
        site.main()
    _refresh_path()


# The session's user site (pip's --user scheme, PIP_USER=1 in the box):
# $HOME/.local/lib/pythonX.Y/site-packages, in the workspace.
_user_site = None        # the user site being watched
_user_site_mtime = None  # its mtime when last looked at
_pth_seen = set()        # its .pth files already processed


def _user_site_dir():
    home = os.environ.get("HOME") or "/home/user"
    return os.path.join(home, ".local", "lib", "python%d.%d" % sys.version_info[:2], "site-packages")


def _refresh_path():
    """Makes what pip installed since the last run importable, without a
    restart, for one stat per run: the user site once it exists (put
    before the system's site-packages, as site would), and, when its
    mtime changed (pip added or removed something), the .pth files not
    processed yet (editable installs, namespace packages: the session's
    own code in its own box) and the import system's caches dropped.
    Other directories of sys.path need nothing: the import system looks
    at their mtimes itself."""
    global _user_site, _user_site_mtime
    d = _user_site_dir()
    try:
        m = os.stat(d).st_mtime_ns
    except OSError:
        return
    if d != _user_site:
        _user_site, _user_site_mtime = d, None
        _pth_seen.clear()
        if d in sys.path:
            # site put it there at start (a rootfs's python3, whose site
            # runs with the user site on): its .pth files are processed.
            _user_site_mtime = m
            _pth_seen.update(_pth_names(d))
            return
        at = len(sys.path)
        for i, p in enumerate(sys.path):
            if p.endswith(("site-packages", "dist-packages")):
                at = i
                break
        sys.path.insert(at, d)
    if m == _user_site_mtime:
        return
    _user_site_mtime = m
    new = sorted(_pth_names(d) - _pth_seen)
    if new:
        import site
        for name in new:
            _pth_seen.add(name)
            site.addpackage(d, name, None)
    import importlib
    importlib.invalidate_caches()


def _pth_names(d):
    try:
        return {n for n in os.listdir(d) if n.endswith(".pth")}
    except OSError:
        return set()


_PIP_HINT = ("quro: this session has no network (policy none): pip can install only wheels "
             "already in the tenant's cache; fetch them with install_packages {manager: pip, "
             "packages: [...]} or use a session with network internet")


def _pip(line):
    """A %pip or !pip line, as IPython runs it: the session's pip in a
    subprocess (its output goes straight to the run's), then what it
    installed is importable at once. It is the `pip` of the box's PATH,
    the shim the shell's `pip` is (in a session without network it has the
    server fetch the wheels), else pip of this interpreter."""
    import shlex
    import shutil
    import subprocess
    try:
        args = shlex.split(line)
    except ValueError as e:
        print("%%pip: %s" % e, file=sys.stderr)
        return
    shim = shutil.which("pip")
    pipdir = os.environ.get("QURO_PIP_DIR")
    if shim:
        cmd = [shim]
    elif pipdir and os.path.isdir(os.path.join(pipdir, "pip")):
        cmd = [sys.executable, os.path.join(pipdir, "pip")]
    else:
        cmd = [sys.executable, "-m", "pip"]
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    rc = subprocess.run(cmd + args).returncode
    _refresh_path()
    if rc != 0:
        msg = "quro: pip exited with status %d" % rc
        if not shim and os.environ.get("QURO_PIP_OFFLINE") == "1":
            msg += "\n" + _PIP_HINT
        print(msg, file=sys.stderr)


def _open_tick():
    global _tick_fd, _tick_id
    try:
        import time  # loaded by the interpreter's start-up: a look-up
        fd = os.timerfd_create(time.CLOCK_MONOTONIC, flags=os.TFD_CLOEXEC)
    except (AttributeError, OSError):
        return  # before 3.13, or refused: the gate
    st = os.fstat(fd)
    _tick_id = (st.st_dev, st.st_ino)
    _tick_fd = fd


def _setup(flush_ms):
    global _libc, _saved_out, _saved_err, _orig_stdin, _main
    global _out, _err, _flush_interval, _flusher
    if sys.flags.no_site:
        _site()
    _out, _err = _make_out(), _make_err()
    sys.stdout = sys.__stdout__ = _out
    sys.stderr = sys.__stderr__ = _err
    _flush_interval = flush_ms / 1000.0
    _gate.acquire()
    _wake.acquire()
    if flush_ms > 0:
        _open_tick()
        # The thread is born with every signal blocked (a thread inherits
        # its creator's mask): a SIGINT for the run must reach the main
        # thread, or stay pending while user code blocks it there. Blocked
        # by the thread's first line instead, one that landed before that
        # line ran (at load, hundreds of ms) interrupted code that had
        # blocked SIGINT.
        old = _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
        try:
            _thread.start_new_thread(_flush_loop, ())
        finally:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, old)
        _flusher = True
    _out.reconfigure(line_buffering=True)  # between runs
    for fd in (REQ_FD, REP_FD):
        os.set_inheritable(fd, False)
    # Duplicates of the Go-side output pipes, for the sync tokens and for
    # repairing fd 1/2 if user code closes or redirects them.
    _saved_out = os.dup(1)
    _saved_err = os.dup(2)
    for fd, saved in ((1, _saved_out), (2, _saved_err)):
        st = os.fstat(saved)
        _saved_ids[fd] = (st.st_dev, st.st_ino)
    global _task_fd, _children_fd
    try:
        _task_fd = os.open("/proc/self/task", os.O_RDONLY | os.O_DIRECTORY)
        _children_fd = os.open("/proc/self/task/%d/children" % _pid, os.O_RDONLY)
    except OSError:
        _task_fd = _children_fd = -1
    _orig_stdin = sys.stdin
    try:
        _libc = _Lib()
        # Orphans of user code become our children, so they can be found
        # and ended with the run instead of escaping to init.
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        # C stdio on a pipe is fully buffered: make printf() from C code
        # reach fd 1 in order with Python's own (unbuffered, -u) writes.
        for name in ("stdout", "stderr"):
            _libc.setvbuf(_Ptr.in_dll(_libc, name), None, 2, 0)  # _IONBF
    except (OSError, AttributeError, ValueError):
        _libc = None
    _signal.signal(_signal.SIGINT, _on_sigint)
    os.register_at_fork(before=_flush_out, after_in_child=_after_fork_in_child)
    os.write = _write
    os._exit = _exit
    os.abort = _abort
    os.fork = _fork_quietly(_os_fork)
    if _os_forkpty is not None:
        os.forkpty = _fork_quietly(_os_forkpty)
    sys.addaudithook(_audit)
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.argv = [""]
    if sys.path[:1] != [""]:  # -c put it there, unless -I or -P
        sys.path.insert(0, "")
    builtins.input = _input
    builtins.display = display
    _main = type(sys)("__main__")
    _main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = _main
    try:
        import faulthandler
        faulthandler.enable(file=sys.__stderr__)
    except Exception:
        pass


def _set_env(env):
    global _session_env_keys
    for k in _session_env_keys - set(env):
        os.environ.pop(k, None)
    for k, v in env.items():
        os.environ[k] = v
    _session_env_keys = set(env)


def _bind(msg):
    cwd = msg.get("cwd")
    if cwd:
        os.chdir(cwd)
    base = msg.get("base") or {}
    for k, v in base.items():
        os.environ[k] = v
    _set_env(msg.get("env") or {})
    # tempfile keeps the directory it first chose; the session's TMPDIR
    # is now in the environment. Not imported otherwise (2 MiB a worker).
    tf = sys.modules.get("tempfile")
    if tf is not None:
        tf.tempdir = None


# ---- rich output --------------------------------------------------------------
#
# How a value looks in a run's result. A plain run shows ONE representation
# of a value, as Jupyter does: the first rich form it has (in _REPRS' order)
# becomes an artifact, and its text repr is printed only when it has none.
# A rich run (a code context's) gets the value's whole mime bundle instead.
# matplotlib figures are shown like Jupyter's inline backend: at plt.show()
# and, for those still open, at the end of the run; each is closed once
# shown. A form that fails (its _repr_*_ raises, a figure cannot be saved)
# or is too big is left out with a note, and the value falls back to the
# next form or to its text: a repr never breaks the run.

# Bounds, in characters of the data (base64 for binary forms): the reply
# frame carries them all as JSON, which may make a character 6 bytes, and
# the Go side refuses a frame over 256 MiB (ending the worker).
_ARTIFACT_MAX = 16 << 20   # one artifact, or one form of a rich result
_RICH_MAX = 32 << 20       # all of a run's artifacts and results
_NOTES_MAX = 20
_rich_run = -1             # the run _rich_used and _rich_notes are for
_rich_used = 0
_rich_notes = []

_REPRS = (
    # (method, artifact kind, mime, file extension), in order of preference
    ("_repr_html_", "html", "text/html", "html"),
    ("_repr_markdown_", "markdown", "text/markdown", "md"),
    ("_repr_svg_", "svg", "image/svg+xml", "svg"),
    ("_repr_png_", "png", "image/png", "png"),
    ("_repr_jpeg_", "jpeg", "image/jpeg", "jpg"),
    ("_repr_latex_", "latex", "text/latex", "tex"),
    ("_repr_json_", "json", "application/json", "json"),
)
# A mime type display(data, mime=...) takes -> (kind, extension).
_KINDS = dict((mime, (kind, ext)) for _, kind, mime, ext in _REPRS)
_KINDS["text/plain"] = ("text", "txt")
_SIGNATURES = {"image/png": (b"\x89PNG\r\n\x1a\n", "PNG"), "image/jpeg": (b"\xff\xd8\xff", "JPEG")}
# Figure formats (QURO_FIGURE_FORMATS, matplotlib's savefig.format).
_FIG_FORMATS = {"png": ("png", "image/png", "png"), "svg": ("svg", "image/svg+xml", "svg"),
                "jpeg": ("jpeg", "image/jpeg", "jpg")}
# display()'s keywords of IPython's that change nothing here.
_DISPLAY_IGNORED = frozenset(("include", "exclude", "metadata", "transient", "display_id", "clear"))


def _rich_state():
    global _rich_run, _rich_used
    if _rich_run != _counter:
        _rich_run, _rich_used = _counter, 0
        del _rich_notes[:]


def _note(msg):
    _rich_state()
    if msg in _rich_notes:
        return
    if len(_rich_notes) < _NOTES_MAX:
        _rich_notes.append(msg)
    elif len(_rich_notes) == _NOTES_MAX:
        _rich_notes.append("more rich outputs had problems; their notes were left out")


def _what(obj):
    """"a DataFrame", "an Image": obj in a note."""
    try:
        name = type(obj).__name__
    except Exception:
        return "a value"
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def _human(n):
    return "%.1f MiB" % (n / 1048576.0) if n >= 1 << 20 else "%d KiB" % (n >> 10) if n >= 1024 else "%d bytes" % n


def _fits(n, what, form):
    """Whether n more characters of what's form fit the bounds (they are
    counted if so); else a note says what was left out."""
    global _rich_used
    _rich_state()
    if n > _ARTIFACT_MAX:
        _note("the %s of %s is %s, over the %s limit of one rich output; it was left out "
              "(write it to a file in the workspace instead)" % (form, what, _human(n), _human(_ARTIFACT_MAX)))
        return False
    if _rich_used + n > _RICH_MAX:
        _note("the %s of %s was left out: the run's rich outputs reached their %s limit "
              "(write it to a file in the workspace instead)" % (form, what, _human(_RICH_MAX)))
        return False
    _rich_used += n
    return True


def _artifact(kind, mime, ext, data, text=None):
    n = len(_artifacts) + 1
    a = {"kind": kind, "mime": mime, "name": "output-%d-%d.%s" % (_counter, n, ext), "data": data}
    if text:
        a["text"] = text
    _artifacts.append(a)


def _add(kind, mime, ext, data, what, text=None):
    if not _fits(len(data), what, kind):
        return False
    _artifact(kind, mime, ext, data, text)
    return True


# An artifact's text: the value's text/plain form beside its rich one (a
# DataFrame's table beside its HTML), for a reader that cannot see the
# page or the image. object's own repr ("<X object at 0x…>") says nothing
# and is left out; a long one keeps its head and tail.
_TEXT_MAX = 4000


def _cut_text(text):
    if len(text) <= _TEXT_MAX:
        return text
    half = _TEXT_MAX // 2
    return "%s\n… (%d characters cut) …\n%s" % (text[:half], len(text) - 2 * half, text[-half:])


def _plain_text(obj):
    """obj's text/plain form for its artifact, or None."""
    try:
        if type(obj).__repr__ is object.__repr__:
            return None
        text = repr(obj)
    except Exception:
        return None
    if not isinstance(text, str) or not text.strip():
        return None
    return _cut_text(text)


def _artifact_data(mime, data):
    """A form's data as an artifact's text: base64 for binary forms."""
    v = _mime_value(mime, data)
    if mime == "application/json":
        return _dumps(v)
    return v


def _claims_all(obj):
    """obj answers every attribute (a __getattr__ that makes anything up):
    its _repr_*_ "methods" are not forms (IPython's canary check)."""
    try:
        return hasattr(obj, "_quro_canary_method_should_not_exist_")
    except Exception:
        return True


def _call_repr(obj, meth, what):
    """obj.meth() (None when obj has no such method), or None and a note
    when it fails."""
    try:
        f = getattr(obj, meth, None)
        if not callable(f):
            return None
        return f()
    except Exception as e:
        _note("%s's %s() failed (%s: %s); that form was left out" % (what, meth, type(e).__name__, _safe_str(e)[:200]))
        return None


def _mimebundle(obj, what):
    data = _call_repr(obj, "_repr_mimebundle_", what)
    if isinstance(data, tuple):
        data = data[0]
    return data if isinstance(data, dict) else None


def _is_figure(obj):
    mod = type(obj).__module__ or ""
    return mod.startswith("matplotlib") and hasattr(obj, "savefig") and hasattr(obj, "canvas")


def _pil_png(obj, what):
    """A PIL image as PNG bytes, for Pillows without _repr_png_ (or whose
    _repr_png_ gave nothing); None when obj is no PIL image."""
    m = sys.modules.get("PIL.Image")
    if m is None or not isinstance(obj, m.Image):
        return None
    try:
        im = obj
        if im.mode not in ("1", "L", "LA", "P", "RGB", "RGBA", "I", "I;16"):
            im = im.convert("RGBA")
        buf = io.BytesIO()
        im.save(buf, "PNG")
        return buf.getvalue()
    except Exception as e:
        _note("%s could not be saved as PNG (%s: %s)" % (what, type(e).__name__, _safe_str(e)[:200]))
        return None


def _fig_formats():
    """The formats figures are shown in: QURO_FIGURE_FORMATS (a list, e.g.
    "png,svg") if set, else matplotlib's savefig.format when it is svg or
    jpeg, else png."""
    env = os.environ.get("QURO_FIGURE_FORMATS", "").strip()
    if env:
        out = []
        for f in env.lower().split(","):
            f = f.strip()
            f = "jpeg" if f == "jpg" else f
            if f in _FIG_FORMATS:
                if f not in out:
                    out.append(f)
            elif f:
                _note("QURO_FIGURE_FORMATS: %r is not png, svg or jpeg; it was ignored" % f)
        if out:
            return out
    try:
        f = str(sys.modules["matplotlib"].rcParams["savefig.format"]).lower()
    except Exception:
        f = "png"
    f = "jpeg" if f == "jpg" else f
    return [f] if f in ("svg", "jpeg") else ["png"]


def _figure_forms(fig):
    """fig saved in each figure format: [(kind, mime, ext, data)]."""
    out = []
    for fmt in _fig_formats():
        kind, mime, ext = _FIG_FORMATS[fmt]
        buf = io.BytesIO()
        try:
            fig.savefig(buf, format=fmt, bbox_inches="tight")
        except Exception as e:
            _note("a figure could not be saved as %s (%s: %s)" % (fmt, type(e).__name__, _safe_str(e)[:200]))
            continue
        b = buf.getvalue()
        if mime == "image/svg+xml":
            data = b.decode("utf-8", "replace")
        else:
            data = binascii.b2a_base64(b, newline=False).decode()
        out.append((kind, mime, ext, data))
    return out


def _close_figure(fig):
    """Closes fig in pyplot once shown: it is not shown again at the end
    of the run (it can still be saved or displayed)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        try:
            plt.close(fig)
        except Exception:
            pass


def _rich(obj):
    """Adds obj's one rich representation as an artifact; False when it has
    none (or none could be made): the caller shows its text repr."""
    if isinstance(obj, type):
        return False
    what = _what(obj)
    if _claims_all(obj):
        return False
    if _is_figure(obj):
        shown = False
        for kind, mime, ext, data in _figure_forms(obj):
            shown = _add(kind, mime, ext, data, "a figure") or shown
        _close_figure(obj)
        return shown
    mb = _mimebundle(obj, what)
    text = None
    if mb is not None and isinstance(mb.get("text/plain"), str):
        text = _cut_text(mb["text/plain"])
    for meth, kind, mime, ext in _REPRS:
        if mb is not None and mime in mb:
            data = mb[mime]
        else:
            data = _call_repr(obj, meth, what)
        if data is None:
            continue
        try:
            data = _artifact_data(mime, data)
        except Exception as e:
            _note("%s's %s form is not valid (%s: %s); it was left out" % (what, kind, type(e).__name__, _safe_str(e)[:200]))
            continue
        if text is None:
            text = _plain_text(obj)
        if _add(kind, mime, ext, data, what, text):
            return True
    png = _pil_png(obj, what)
    if png is not None:
        return _add("png", "image/png", "png", binascii.b2a_base64(png, newline=False).decode(), what, _plain_text(obj))
    return False


def _raw_form(mime, data):
    """data given for mime to display(): its text (binary forms in base64,
    checked), or ValueError saying what is wrong."""
    if mime not in _KINDS:
        raise ValueError("display(): mime %r is not one of %s" % (mime, ", ".join(sorted(_KINDS))))
    sig = _SIGNATURES.get(mime)
    if sig is not None:
        if isinstance(data, str):
            try:
                b = binascii.a2b_base64(data.strip(), strict_mode=True)
            except (binascii.Error, ValueError):
                raise ValueError("display(): a str given as %s must be base64 (or pass the bytes)" % mime) from None
        elif isinstance(data, (bytes, bytearray, memoryview)):
            b = bytes(data)
        else:
            raise TypeError("display(): %s data must be bytes (or base64 str), not %s" % (mime, type(data).__name__))
        if not b.startswith(sig[0]):
            raise ValueError("display(): the data given as %s is not a %s image (it does not start with the %s signature)"
                             % (mime, sig[1], sig[1]))
        return binascii.b2a_base64(b, newline=False).decode()
    if mime == "application/json":
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = bytes(data).decode("utf-8")
        if isinstance(data, str):
            try:
                return _loads(data)
            except ValueError as e:
                raise ValueError("display(): the data given as application/json is not JSON (%s)" % e) from None
        try:
            _dumps(data)
        except (TypeError, ValueError) as e:
            raise ValueError("display(): the data given as application/json cannot be JSON (%s)" % e) from None
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data).decode("utf-8", "replace")
    if isinstance(data, str):
        return data
    raise TypeError("display(): %s data must be str or bytes, not %s" % (mime, type(data).__name__))


def _display_raw(bundle, what):
    """Shows a mime bundle given as data (display(..., mime=) or raw=True)."""
    if _rich_mode:
        b = {}
        for mime, v in bundle.items():
            if mime != "text/plain" and not _fits(len(v) if isinstance(v, str) else len(_dumps(v)), what, mime):
                continue
            b[mime] = v
        b.setdefault("text/plain", what)
        _results.append({"data": b})
        return
    for _, kind, mime, ext in _REPRS + ((None, "text", "text/plain", "txt"),):
        if mime not in bundle:
            continue
        v = bundle[mime]
        if mime == "text/plain":
            print(v)
            return
        if mime == "application/json":
            v = _dumps(v)
        text = bundle.get("text/plain")
        if _add(kind, mime, ext, v, what, _cut_text(text) if isinstance(text, str) else None):
            return
        print(what)
        return


def display(*objs, mime=None, raw=False, **kwargs):
    """Shows objects in the run's result, as Jupyter's display() does. An
    object becomes an artifact from its first rich form (_repr_html_,
    _repr_markdown_, _repr_svg_, _repr_png_, _repr_jpeg_, _repr_latex_,
    _repr_json_ or _repr_mimebundle_; a matplotlib figure, a PIL image);
    anything else is printed as repr().
    display(data, mime="image/png"): data (bytes, or base64 str for binary
    types; str for text ones) shown as that type: image/png, image/jpeg,
    image/svg+xml, text/html, text/markdown, text/latex, application/json,
    text/plain.
    display({"image/png": b64, "text/plain": "..."}, raw=True): a mime
    bundle, as IPython takes it."""
    for k in kwargs:
        if k not in _DISPLAY_IGNORED:
            raise TypeError("display() got an unexpected keyword argument %r (it takes mime= and raw=)" % k)
    for obj in objs:
        if mime is not None:
            if not isinstance(mime, str):
                raise TypeError("display(): mime must be a str such as 'image/png'")
            n = len(obj) if isinstance(obj, (bytes, bytearray, memoryview, str)) else 0
            _display_raw({mime: _raw_form(mime, obj)}, "<%s, %s>" % (mime, _human(n)))
        elif raw:
            if not isinstance(obj, dict):
                raise TypeError("display(..., raw=True) takes a dict of mime type -> data, not %s" % type(obj).__name__)
            b = dict((m, _raw_form(m, v)) for m, v in obj.items())
            if not b:
                raise ValueError("display(..., raw=True): the bundle is empty")
            _display_raw(b, b.get("text/plain") or "<%s>" % ", ".join(sorted(b)))
        elif _rich_mode:
            _results.append({"data": _bundle(obj)})
        elif not _rich(obj):
            try:
                text = repr(obj)
            except Exception as e:
                text = "<repr failed: %s: %s>" % (type(e).__name__, _safe_str(e)[:200])
            print(text)


# Rich mode (code contexts): a value's mime bundle, as Jupyter builds it
# from the _repr_*_ methods. Text forms stay text, binary ones are base64,
# application/json a JSON value.
_MIMES = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_pdf_", "application/pdf"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_javascript_", "application/javascript"),
)
_BINARY = ("image/png", "image/jpeg", "application/pdf")


def _mime_value(mime, data):
    if isinstance(data, tuple):  # (data, metadata)
        data = data[0]
    if mime in _BINARY:
        if isinstance(data, str):
            return data.strip()
        return binascii.b2a_base64(bytes(data), newline=False).decode()
    if mime == "application/json":
        if isinstance(data, (str, bytes)):
            return _loads(data)
        _dumps(data)  # refuses what is not JSON
        return data
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return str(data)


def _bundle(obj):
    """obj's forms: text/plain (its repr) always, the others it has."""
    try:
        text = repr(obj)
    except BaseException as e:
        text = "<repr failed: %s>" % _safe_str(e)
    b = {"text/plain": text}
    if isinstance(obj, type):
        return b
    what = _what(obj)
    forms = {}
    if _claims_all(obj):
        return b
    if _is_figure(obj):
        for _, mime, _, data in _figure_forms(obj):
            forms[mime] = data
        _close_figure(obj)
    else:
        mb = _mimebundle(obj, what)
        for mime, v in (mb or {}).items():
            try:
                forms[mime] = _mime_value(mime, v)
            except Exception as e:
                _note("%s's %s form is not valid (%s: %s); it was left out" % (what, mime, type(e).__name__, _safe_str(e)[:200]))
        for meth, mime in _MIMES:
            if mime in forms:
                continue
            data = _call_repr(obj, meth, what)
            if data is None:
                continue
            try:
                forms[mime] = _mime_value(mime, data)
            except Exception as e:
                _note("%s's %s form is not valid (%s: %s); it was left out" % (what, mime, type(e).__name__, _safe_str(e)[:200]))
        if "image/png" not in forms:
            png = _pil_png(obj, what)
            if png is not None:
                forms["image/png"] = binascii.b2a_base64(png, newline=False).decode()
        data = _frame_data(obj, what)
        if data is not None:
            forms[_DATA_MIME] = data
    for mime, v in forms.items():
        if mime == "text/plain":
            b[mime] = v
            continue
        n = len(v) if isinstance(v, str) else len(_dumps(v))
        if _fits(n, what, mime):
            b[mime] = v
    return b


# A pandas DataFrame's values as data, beside its table: {column: [values]}
# (to_dict's "list" orient, as JSON: numpy numbers as numbers, NaN as null,
# times as ISO 8601 text), under E2B's media type for it, so that a client
# can use the numbers without parsing HTML (E2B's kernel gives the same as a
# result's `data`). A frame over _DATA_CELLS cells is left out with a note:
# its table is still there.
_DATA_MIME = "e2b/data"
_DATA_CELLS = 1000000


def _frame_data(obj, what):
    pd = sys.modules.get("pandas")
    frame = getattr(pd, "DataFrame", None) if pd is not None else None
    if frame is None or not isinstance(obj, frame):
        return None
    try:
        if obj.size > _DATA_CELLS:
            _note("the data of %s of %d cells was left out (over %d); its table is shown"
                  % (what, obj.size, _DATA_CELLS))
            return None
        out = {}
        for i in range(obj.shape[1]):
            col = obj.iloc[:, i]
            key = obj.columns[i]
            out[key if isinstance(key, str) else str(key)] = _loads(col.to_json(orient="values", date_format="iso"))
        return out
    except Exception as e:
        _note("the data of %s could not be made (%s: %s); it was left out" % (what, type(e).__name__, _safe_str(e)[:200]))
        return None


def _show_all():
    """Shows every figure pyplot has open, and closes them (Jupyter's
    inline backend)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        figs = [m.canvas.figure for m in sys.modules["matplotlib._pylab_helpers"].Gcf.get_all_fig_managers()]
    except Exception:
        try:
            figs = [plt.figure(n) for n in plt.get_fignums()]
        except Exception:
            return
    for fig in figs:
        try:
            if _rich_mode:
                _results.append({"data": _bundle(fig)})
            else:
                _rich(fig)
        except Exception as e:
            _note("a figure could not be shown (%s: %s)" % (type(e).__name__, _safe_str(e)[:200]))
        _close_figure(fig)


def _hook_pyplot(plt):
    """Makes plt.show() show the open figures in the run's result (and close
    them), as Jupyter's inline backend does; the Agg backend's own show
    only warns that it cannot."""
    show = getattr(plt, "show", None)
    if show is None or getattr(show, "_quro", False):
        return

    def show_(*args, **kwargs):
        _show_all()
    show_._quro = True
    show_.__wrapped__ = show
    show_.__doc__ = show.__doc__
    show_.__module__ = plt.__name__
    show_.__qualname__ = show_.__name__ = "show"
    plt.show = show_


def _hook_pil(mod):
    """Makes a PIL image's show() show it in the run's result, and its
    save() to a file name show it too, as E2B's kernel patches Pillow (its
    startup script 0003_images.py): code written for a notebook or for E2B
    gets its image back. show() opens no viewer: a box has no display."""
    image = getattr(mod, "Image", None)
    if not isinstance(image, type) or getattr(image.save, "_quro", False):
        return
    save = image.save

    def save_(self, fp, format=None, **params):
        if isinstance(fp, (str, os.PathLike)):
            display(self)
        return save(self, fp, format, **params)

    def show_(self, title=None, **options):
        display(self)
    for f, orig in ((save_, save), (show_, image.show)):
        f._quro = True
        f.__wrapped__ = orig
        f.__doc__ = orig.__doc__
        f.__module__ = orig.__module__
        f.__qualname__ = orig.__qualname__
        f.__name__ = orig.__name__
    image.save = save_
    image.show = show_


# Modules hooked when they are loaded: name -> the hook.
_HOOKS = {"matplotlib.pyplot": _hook_pyplot, "PIL.Image": _hook_pil}


class _ImportHook:
    """A finder that finds nothing itself: when a module of _HOOKS is about
    to be loaded, it has the other finders find it and runs its hook on the
    module once it is loaded. Costs a call and a lookup per import of a
    module not yet loaded; the hooked modules are never imported for it."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        hook = _HOOKS.get(name)
        if hook is None:
            return None
        spec = None
        for f in sys.meta_path:
            find = getattr(f, "find_spec", None)
            if f is _ImportHook or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        if spec is None:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_and_hook(module):
            exec_module(module)
            hook(module)
        try:
            spec.loader.exec_module = exec_and_hook  # this spec's own loader
        except Exception:
            pass
        return spec


sys.meta_path.insert(0, _ImportHook)
for _name, _hook in _HOOKS.items():
    if _name in sys.modules:  # loaded before the hook could see it
        _hook(sys.modules[_name])


def _show_figures(notes=None):
    """At the end of a run: the figures still open are shown (and closed),
    and the run's notes about rich outputs go to notes."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        _hook_pyplot(plt)  # imported before the hook could see it
        _show_all()
    if notes is not None and _rich_run == _counter:
        notes.extend(_rich_notes)
        del _rich_notes[:]


# ---- a run ------------------------------------------------------------------

def _strip_worker_frames(exc, seen):
    """Unlinks the worker's own frames from exc's traceback (and from the
    exceptions it chains), so that tracebacks show user code only."""
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tbs = []
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename != __file__:
                tbs.append(tb)
            tb = tb.tb_next
        for a, b in zip(tbs, tbs[1:]):
            a.tb_next = b
        if tbs:
            tbs[-1].tb_next = None
        exc.__traceback__ = tbs[0] if tbs else None
        for sub in getattr(exc, "exceptions", None) or ():
            _strip_worker_frames(sub, seen)
        if exc.__cause__ is not None:
            _strip_worker_frames(exc.__cause__, seen)
        exc = exc.__context__


def _user_traceback(exc):
    """Prints exc as Python would, without the worker's own frames."""
    try:
        _strip_worker_frames(exc, set())
        sys.last_exc = exc
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        import traceback
        traceback.print_exception(exc, file=sys.stderr)
        sys.stderr.flush()
    except BaseException:
        _write_all(2, ("%s: %s\n" % (type(exc).__name__, _safe_str(exc))).encode("utf-8", "replace"))


def _exception(exc):
    """exc as a structured error (rich mode), its traceback as Python
    prints it without the worker's frames."""
    try:
        _strip_worker_frames(exc, set())
        sys.last_exc = exc
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        import traceback
        tb = "".join(traceback.format_exception(exc))
    except BaseException:
        tb = "%s: %s\n" % (type(exc).__name__, _safe_str(exc))
    return {"name": type(exc).__name__, "value": _safe_str(exc), "traceback": tb}


def _safe_str(exc):
    try:
        return str(exc)
    except BaseException:
        return "<unprintable>"


def _source_text(src):
    if b"coding" not in src[:512]:
        return src.decode("utf-8", "surrogateescape")
    try:
        from importlib.util import decode_source
        return decode_source(src)
    except BaseException:
        return src.decode("utf-8", "replace")


# The value of a trailing expression is stored under this name by the
# compiled code and taken out of the namespace right after the run.
_LAST = "__quro_last_value__"
_CO_COROUTINE = 0x80
_FLAGS = _ast.PyCF_ONLY_AST | _ast.PyCF_ALLOW_TOP_LEVEL_AWAIT

# Compiled code of recent sources: an agent often runs the same code again
# (a poll, a re-run after fixing a file). Keyed by the source bytes; the code
# keeps the file name of the run that compiled it, whose source lines stay
# in linecache, so its tracebacks stay right.
_code_cache = {}
_CODE_CACHE_MAX = 64
_CODE_CACHE_SRC_MAX = 64 << 10


def _compile(src, filename):
    """Returns (code, has_last) for src: one code object whose trailing
    expression, if any, assigns its value to _LAST."""
    hit = _code_cache.get(src)
    if hit is not None:
        return hit
    tree = compile(src, filename, "exec", _FLAGS, dont_inherit=True)
    has_last = False
    if tree.body and isinstance(tree.body[-1], _ast.Expr):
        expr = tree.body[-1]
        loc = {"lineno": expr.lineno, "col_offset": expr.col_offset,
               "end_lineno": expr.end_lineno, "end_col_offset": expr.end_col_offset}
        target = _ast.Name(id=_LAST, ctx=_ast.Store(), **loc)
        tree.body[-1] = _ast.Assign(targets=[target], value=expr.value, **loc)
        has_last = True
    code = compile(tree, filename, "exec", _ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    if len(src) <= _CODE_CACHE_SRC_MAX:
        if len(_code_cache) >= _CODE_CACHE_MAX:
            del _code_cache[next(iter(_code_cache))]
        _code_cache[src] = (code, has_last)
    return code, has_last


def _pip_args(body):
    """The arguments of a "%pip ..." / "!pip ..." line (pip3 too), or None."""
    if body[:1] not in ("%", "!") or not body.startswith("pip", 1):
        return None
    rest = body[4:]
    if rest.startswith("3"):
        rest = rest[1:]
    if rest and rest[0] not in " \t\r\n":
        return None
    return rest.strip()


def _leading_indent(src):
    """src without the indentation of its first line that is not blank,
    taken from every line that starts with it (IPython's leading_indent,
    after its leading_empty_lines); None when that line is not indented, or
    when src declares its encoding (re-encoded, it would be misread)."""
    if b"coding" in src[:512]:
        return None
    lines = _source_text(src).splitlines(True)
    first = next((line for line in lines if line.strip()), "")
    indent = first[:len(first) - len(first.lstrip(" \t"))]
    if not indent:
        return None
    n = len(indent)
    return "".join(line[n:] if line.startswith(indent) else line for line in lines).encode("utf-8", "surrogateescape")


def _shell_lines(src, rich=True):
    """src with its "%pip ..." and "!pip ..." lines made calls of _pip and,
    when rich (a notebook cell), its other "!command" lines made calls of
    the shell; or None when it has none."""
    lines = _source_text(src).splitlines(True)
    found = False
    for i, line in enumerate(lines):
        body = line.lstrip()
        indent = line[:len(line) - len(body)]
        args = _pip_args(body)
        if args is not None:
            lines[i] = "%s__import__('sys').modules[%r]._pip(%r); pass\n" % (indent, __name__, args)
            found = True
        elif rich and body.startswith("!"):
            cmd = body[1:].rstrip("\r\n")
            # A statement, not an expression: as in IPython, the line
            # prints what the command prints and has no value of its own
            # (a last line would else show a CompletedProcess result).
            lines[i] = "%s__import__('subprocess').run(%r, shell=True); pass\n" % (indent, cmd)
            found = True
    if not found:
        return None
    return "".join(lines).encode()


def _execute(src, filename, ns):
    """Compiles and runs src in the namespace ns; the value of a trailing
    expression is shown: as an artifact when it has a rich form, else
    through sys.displayhook, as in a REPL (rich mode: as the main result)."""
    global _running, _interrupted
    try:
        code, has_last = _compile(src, filename)
    except SyntaxError:
        # Rich mode (a notebook cell): a cell indented as a whole runs
        # (IPython's leading_indent: E2B's SDK tests send code indented
        # inside template strings), and IPython's "!command" lines run the
        # command in a shell, as E2B's kernel does; "%pip"/"!pip" lines run
        # pip in every mode. Only code that is not Python as it stands is
        # read so: a "!" line inside a string of valid code stays what it is.
        cell = _leading_indent(src) if _rich_mode else None
        shell = _shell_lines(cell or src, _rich_mode)
        if shell is None and cell is None:
            raise
        code, has_last = _compile(shell or cell, filename)
    if has_last:
        ns.pop(_LAST, None)
    # A SIGINT sent for the run before may be pending still (the server
    # waits until the box's init has sent it before the next request, so
    # its C handler ran, but its Python handler may not have yet):
    # pthread_sigmask runs pending handlers, here while _running is False,
    # so that it is dropped and never interrupts this run.
    _signal.pthread_sigmask(_signal.SIG_BLOCK, ())
    _running = True
    r = eval(code, ns)
    if code.co_flags & _CO_COROUTINE:
        r = _run_coroutine(r)
    _running = False
    if has_last:
        value = ns.pop(_LAST, None)
        if value is not None and _rich_mode:
            builtins._ = value
            _results.append({"main": True, "data": _bundle(value)})
        elif value is not None:
            # One representation, as Jupyter shows: a value with a rich
            # form becomes an artifact only; its text repr is printed only
            # when it has none. Either way it is _ afterwards.
            if _rich(value):
                builtins._ = value
            else:
                sys.displayhook(value)


def _run_coroutine(coro):
    global _loop
    import asyncio
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(coro)


def _flush_streams(notes):
    global _out, _err
    for s in (sys.stdout, sys.stderr, _out):
        try:
            s.flush()
        except BaseException:
            pass
    if _libc is not None:
        try:
            _libc.fflush(None)
        except BaseException:
            pass
    # Repair fd 1/2 and sys.stdout/sys.stderr if the run closed them.
    for fd, saved, name in ((1, _saved_out, "stdout"), (2, _saved_err, "stderr")):
        try:
            a = os.fstat(fd)
            same = (a.st_dev, a.st_ino) == _saved_ids[fd]
        except OSError:
            same = False
        if not same:
            os.dup2(saved, fd)
            notes.append("the code closed or redirected file descriptor %d (%s); it was restored" % (fd, name))
        s = getattr(sys, name)
        if getattr(s, "closed", True):
            if fd == 1:
                s = _out = _make_out()
            else:
                s = _err = _make_err()
            setattr(sys, name, s)
            setattr(sys, "__%s__" % name, s)
            notes.append("the code closed sys.%s; it was reopened" % name)


def _end_children():
    """Kills the processes a run left behind (as subreaper, orphans are our
    children too) and reaps them. Returns descriptions of those that were
    still running."""
    killed = []
    if _no_children():
        return killed
    for _ in range(100):
        kids = _children(_pid)
        if not kids:
            break
        tree, stack = [], list(kids)
        while stack:
            p = stack.pop()
            tree.append(p)
            stack.extend(_children(p))
        for p in tree:
            state, cmd = _describe(p)
            if state is not None and state != "Z" and not any(k["pid"] == p for k in killed):
                killed.append({"pid": p, "cmd": cmd})
            try:
                os.kill(p, _signal.SIGKILL)
            except OSError:
                pass
        for p in kids:
            try:
                os.waitpid(p, 0)
            except ChildProcessError:
                pass
            except OSError:
                pass
    return killed


def _no_children():
    """The common case, in an fstat and a pread: one thread (procfs counts
    a process's threads in the link count of its task directory: 2 + N),
    and it has no children."""
    if _task_fd < 0 or _children_fd < 0:
        return False
    try:
        threads = 2 if _flusher else 1
        return os.fstat(_task_fd).st_nlink == 2 + threads and not os.pread(_children_fd, 64, 0).strip()
    except OSError:
        return False


def _children(pid):
    out = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for t in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, t), "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return out


def _describe(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
        state = stat[stat.rindex(b")") + 2:][:1].decode()
    except (OSError, ValueError):
        return None, ""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmd = f.read().replace(b"\0", b" ").strip().decode("utf-8", "replace")
    except OSError:
        cmd = ""
    return state, cmd[:200]


def _enter_context(msg, notes):
    """Switches to the run's context (namespace, cwd, env); returns what
    _leave_context needs to switch back."""
    global _default_count
    cid = msg.get("ctx")
    saved_env = {}
    for k, v in (msg.get("renv") or {}).items():
        saved_env[k] = os.environ.get(k)
        os.environ[k] = v
    if cid is None:
        _default_count += 1
        return None, _main.__dict__, _default_count, None, saved_env
    c = _ctxs.get(cid)
    if c is None:
        m = type(sys)("__main__")
        m.__dict__["__builtins__"] = builtins
        c = _ctxs[cid] = [m, msg.get("cwd") or "", 0]
    c[2] += 1
    try:
        prev = os.getcwd()
    except OSError:
        prev = None
    if c[1]:
        try:
            os.chdir(c[1])
        except OSError as e:
            alt = None
            ws = msg.get("ws")
            if ws and (c[1] == "/home/user" or c[1].startswith("/home/user/")):
                alt = ws + c[1][len("/home/user"):]
            try:
                if alt is None:
                    raise e
                os.chdir(alt)
                c[1] = alt
            except OSError:
                notes.append("the context's directory %s is not usable (%s); the run stays in %s"
                             % (c[1], e.strerror, prev))
    sys.modules["__main__"] = c[0]
    return c, c[0].__dict__, c[2], prev, saved_env


def _leave_context(c, prev, saved_env):
    if c is not None:
        try:
            c[1] = os.getcwd()
        except OSError:
            pass
        sys.modules["__main__"] = _main
        if prev is not None:
            try:
                os.chdir(prev)
            except OSError:
                pass
    for k, v in saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _run(msg):
    global _counter, _running, _interrupted, _artifacts, _in_run
    global _rich_mode, _results
    _counter += 1
    _interrupted = False
    _in_run = True
    if "env" in msg:
        _set_env(msg["env"] or {})
    _refresh_path()
    contextual = bool(msg.get("cx"))
    _rich_mode = bool(msg.get("rich"))
    _results = []
    exc_info = None
    src = msg.get("payload", b"")
    filename = "<run %d>" % _counter
    if src not in _code_cache:
        lines = _source_text(src).splitlines(True)
        linecache.cache[filename] = (len(src), None, lines, filename)
    status, exit_code, notes = "ok", 0, []
    c, ns, count, prev, saved_env = _enter_context(msg, notes)
    _output_live(True)
    try:
        try:
            _execute(src, filename, ns)
        finally:
            _running = False
            if _interrupted and not _in_child:
                # The code stopped after an interrupt: the server's grace
                # (the code's time to stop) ends here, not at the reply,
                # which may first import traceback (59 modules, ~50 ms of
                # CPU: seconds in a starved box).
                _send({"op": "stopped", "id": msg["id"]})
        if _in_child:
            _exit(0)
    except SystemExit as e:
        if _in_child:
            _exit(e.code if isinstance(e.code, int) else 1)
        status = "exit"
        if e.code is None:
            exit_code = 0
        elif isinstance(e.code, int):
            exit_code = e.code
        else:
            exit_code = 1
            try:
                print(e.code, file=sys.stderr)
            except BaseException:
                pass
    except KeyboardInterrupt as e:
        if _in_child:
            _exit(130)
        status = "interrupted" if _interrupted else "error"
        exit_code = 130 if _interrupted else 1
        if _rich_mode:
            exc_info = _exception(e)
        else:
            _user_traceback(e)
    except BaseException as e:
        if _in_child:
            _exit(1)
        status, exit_code = "error", 1
        if _rich_mode:
            exc_info = _exception(e)
        else:
            _user_traceback(e)
    _running = False
    _in_run = False
    _show_figures(notes)
    _leave_context(c, prev, saved_env)
    _rich_mode = False
    _flush_streams(notes)
    _output_live(False)
    killed = _end_children()
    token = msg["token"].encode()
    with _raw_lock:  # after any flush still writing the run's output
        _write_all(_saved_out, token)
        _write_all(_saved_err, token)
    arts, _artifacts = _artifacts, []
    rep = {"op": "done", "id": msg["id"], "status": status, "exit_code": exit_code,
           "artifacts": arts, "killed": killed, "notes": notes}
    if contextual:
        rep["count"] = count
        rep["results"], _results = _results, []
        if exc_info is not None:
            rep["exc"] = exc_info
    return rep


def main(env_keys=(), flush_ms=20):
    """env_keys: the names of the session's variables already in the
    environment. flush_ms: the flush interval of stdout while a run is in
    progress (0: no flush thread; the tests use it to see the other flushes
    alone). A spare imports nothing more than any worker: traceback and
    tempfile (2.5 MiB in 3.14) are imported by the first run that needs
    them, in every session alike."""
    global _session_env_keys
    _setup(flush_ms)
    _session_env_keys = set(env_keys)
    _send({"op": "hello", "pid": _pid, "version": sys.version.split()[0]})
    while True:
        try:
            msg = _recv()
        except KeyboardInterrupt:
            continue
        if msg is None:
            _exit(0)
        op = msg.get("op")
        try:
            if op == "run":
                rep = _run(msg)
            elif op == "drop":
                _ctxs.pop(msg.get("ctx"), None)
                rep = {"op": "dropped"}
            elif op == "bind":
                _bind(msg)
                rep = {"op": "bound"}
            else:
                rep = {"op": "error", "error": "unknown op %r" % (op,)}
        except KeyboardInterrupt:
            # A late interrupt inside the worker's own code: the run is over.
            _flush_streams([])
            _output_live(False)
            rep = {"op": "done", "id": msg.get("id"), "status": "interrupted", "exit_code": 130,
                   "artifacts": [], "killed": [], "notes": ["interrupted while finishing the run"]}
            if op == "run":
                _write_all(_saved_out, msg["token"].encode())
                _write_all(_saved_err, msg["token"].encode())
        _send(rep)
