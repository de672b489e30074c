package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/e2b/gen/process"
	"github.com/quro-dev/quro/internal/api/e2b/gen/process/processconnect"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/proc"
	"github.com/quro-dev/quro/internal/runcode"
)

// envd's process service (process.Process) on the session's background
// processes: Start and Connect stream the capabilities start_process and
// connect_process (start{pid} first, then data, keepalives, end last);
// the unary methods are list_processes, send_process_input,
// close_process_stdin, signal_process and resize_process.

// envdProcessRoutes serves envd's process.Process (Connect-RPC).
func (s *Server) envdProcessRoutes(m *http.ServeMux) {
	path, h := processconnect.NewProcessHandler(&processService{s: s}, s.envdHandlerOptions()...)
	m.Handle(path, h)
}

type processService struct{ s *Server }

var _ processconnect.ProcessHandler = (*processService)(nil)

// selector turns E2B's process selector into the capabilities' one. As
// envd answers them: a pid or tag no process has (0, "") is not_found
// (the SDKs' kill() then returns false), a selector of neither kind
// unimplemented.
func selector(ctx context.Context, sel *process.ProcessSelector) (app.ProcessSelector, error) {
	out := app.ProcessSelector{Session: sandboxOf(ctx)}
	switch v := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		out.Pid = int(v.Pid)
		if out.Pid <= 0 {
			return out, rpcErrorf(connect.CodeNotFound, "no process has pid 0: give one that start or list reported")
		}
	case *process.ProcessSelector_Tag:
		out.Tag = v.Tag
		if out.Tag == "" {
			return out, rpcErrorf(connect.CodeNotFound, "no process has an empty tag: give the tag it was started with")
		}
	default:
		return out, rpcErrorf(connect.CodeUnimplemented, "name the process: process.pid or process.tag")
	}
	return out, nil
}

// eventStream sends a stream's events: from the call's goroutine (start,
// data, end) and from the keepalive's, one at a time.
type eventStream struct {
	mu     sync.Mutex
	send   func(*process.ProcessEvent) error
	err    error              // the first failed send: the client is gone
	cancel context.CancelFunc // ends the call when a send fails
	kick   chan struct{}      // output went out: the keepalive waits anew
	stop   chan struct{}
	done   sync.WaitGroup
	once   sync.Once
}

// stopKeepalive stops the keepalive and waits until it can send no more.
func (es *eventStream) stopKeepalive() {
	es.once.Do(func() {
		close(es.stop)
		es.done.Wait()
	})
}

func (es *eventStream) emit(ev *process.ProcessEvent) {
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.err != nil {
		return
	}
	if err := es.send(ev); err != nil {
		es.err = err
		es.cancel()
	}
}

// keepalive sends a keepalive event whenever every passes without output.
func (es *eventStream) keepalive(every time.Duration) {
	es.done.Add(1)
	go func() {
		defer es.done.Done()
		t := time.NewTimer(every)
		defer t.Stop()
		for {
			select {
			case <-es.stop:
				return
			case <-es.kick:
				t.Reset(every)
			case <-t.C:
				es.emit(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}})
				t.Reset(every)
			}
		}
	}()
}

// ptyReadyWait bounds how long a new terminal's start event waits for
// its first output (see follow).
const ptyReadyWait = 3 * time.Second

// follow runs a streaming process capability and sends its events.
// killOnDeadline says what the request's deadline (Connect-Timeout-Ms)
// meant: the process was killed (Start), or only the stream ends
// (Connect).
func (p *processService) follow(ctx context.Context, h http.Header, name string, in any, killOnDeadline bool, send func(*process.ProcessEvent) error) error {
	callCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	es := &eventStream{send: send, cancel: cancel, kick: make(chan struct{}, 1), stop: make(chan struct{})}
	defer es.stopKeepalive()
	every := keepaliveInterval(h)
	// A new terminal's start event waits for its first output (a shell's
	// first prompt: it has read its start-up files), at most
	// ptyReadyWait: the SDK's pty.create returns on the start event, and
	// its caller then types at once and reads the answer after a fixed
	// pause (E2B's ptyConnect test waits 300 ms); on a loaded machine a
	// login shell's start-up alone takes longer. envd answers at once, but
	// its sandbox is a VM of its own. Output that comes first is sent after
	// the start event, never lost.
	var (
		hold      sync.Mutex
		startPid  = -1 // the process's, once it started
		sentStart bool
		holdTimer *time.Timer
	)
	sendStart := func() {
		hold.Lock()
		defer hold.Unlock()
		if sentStart || startPid < 0 {
			return
		}
		sentStart = true
		if holdTimer != nil {
			holdTimer.Stop()
		}
		es.emit(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(startPid)}}})
		es.keepalive(every)
	}
	st, isStart := in.(app.StartProcessInput)
	holdStart := isStart && st.PTY != nil
	defer func() {
		hold.Lock()
		if holdTimer != nil {
			holdTimer.Stop()
		}
		hold.Unlock()
	}()
	callCtx = runcode.WithStarted(callCtx, func(pid int) {
		hold.Lock()
		startPid = pid
		if holdStart {
			holdTimer = time.AfterFunc(ptyReadyWait, sendStart)
		}
		hold.Unlock()
		if !holdStart {
			sendStart()
		}
	})
	callCtx = runcode.WithOutput(callCtx, func(stream string, b []byte) {
		sendStart()
		d := &process.ProcessEvent_DataEvent{}
		switch stream {
		case "stdout":
			d.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: b}
		case "stderr":
			d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: b}
		case "pty":
			d.Output = &process.ProcessEvent_DataEvent_Pty{Pty: b}
		default:
			return
		}
		es.emit(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}})
		select {
		case es.kick <- struct{}{}:
		default:
		}
	})
	out, err := invoke[*app.ProcessResult](callCtx, p.s, name, in)
	if err != nil {
		return rpcError(err)
	}
	if cerr := ctx.Err(); cerr != nil || out.Running {
		switch {
		case errors.Is(cerr, context.DeadlineExceeded) && killOnDeadline:
			return rpcErrorf(connect.CodeDeadlineExceeded, "the command's timeout (timeoutMs, Connect-Timeout-Ms) passed: process "+strconv.Itoa(out.Pid)+" was killed")
		case errors.Is(cerr, context.DeadlineExceeded):
			return rpcErrorf(connect.CodeDeadlineExceeded, "the connection's timeout (timeoutMs) passed; process "+strconv.Itoa(out.Pid)+" runs on")
		case cerr != nil:
			return rpcErrorf(connect.CodeCanceled, "the request was canceled; process "+strconv.Itoa(out.Pid)+" runs on")
		}
		es.mu.Lock()
		serr := es.err
		es.mu.Unlock()
		if serr != nil {
			return serr
		}
		// Only a destroy of the session ends the call so: its calls are
		// ended first, then its box. E2B's client sees a killed sandbox
		// as a dropped connection ("terminated") and then probes its
		// health; wait (bounded) until the sandbox is gone, so that the
		// probe finds it gone.
		p.s.waitGone(ctx)
		return rpcErrorf(connect.CodeUnknown, "terminated: sandbox "+sandboxOf(ctx)+" was killed while process "+strconv.Itoa(out.Pid)+" ran")
	}
	sendStart() // a terminal that ended before showing anything
	// The end is the stream's last event: no keepalive after it.
	es.stopKeepalive()
	end := &process.ProcessEvent_EndEvent{ExitCode: int32(out.ExitCode), Exited: out.Exited, Status: out.Status}
	if out.Error != "" {
		end.Error = &out.Error
	}
	es.emit(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}})
	es.mu.Lock()
	defer es.mu.Unlock()
	return es.err
}

func (p *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	if err := p.s.checkUser(req.Header()); err != nil {
		return err
	}
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return rpcErrorf(connect.CodeInvalidArgument, "process.cmd is empty: name the program to run")
	}
	in := app.StartProcessInput{Session: sandboxOf(ctx), Cmd: cfg.GetCmd(), Args: cfg.GetArgs(), Env: cfg.GetEnvs(), Cwd: cfg.GetCwd(), Tag: req.Msg.GetTag(),
		// Absent means on, as envd's proto says (older SDKs).
		Stdin: req.Msg.Stdin == nil || req.Msg.GetStdin()}
	if t := req.Header().Get("Connect-Timeout-Ms"); t != "" {
		ms, err := strconv.ParseInt(t, 10, 64)
		if err != nil || ms < 0 {
			return rpcErrorf(connect.CodeInvalidArgument, "Connect-Timeout-Ms "+strconv.Quote(t)+" is not a number of milliseconds")
		}
		in.TimeoutMS = ms
	}
	if pt := req.Msg.GetPty(); pt != nil {
		in.PTY = &proc.Size{Cols: int(pt.GetSize().GetCols()), Rows: int(pt.GetSize().GetRows())}
	}
	return p.follow(ctx, req.Header(), "start_process", in, true, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	})
}

func (p *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	sel, err := selector(ctx, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	// A terminal's earlier output first (the last 64 KiB kept), so that
	// pty.connect can redraw it; a command's output (commands.connect)
	// is followed from now on, as envd does.
	in := app.ConnectProcessInput{ProcessSelector: sel, ReplayTerminal: true}
	return p.follow(ctx, req.Header(), "connect_process", in, false, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: ev})
	})
}

func (p *processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	out, err := invoke[*app.ProcessList](ctx, p.s, "list_processes", app.SessionRef{Session: sandboxOf(ctx)})
	if err != nil {
		return nil, rpcError(err)
	}
	res := &process.ListResponse{Processes: make([]*process.ProcessInfo, 0, len(out.Processes))}
	for _, pi := range out.Processes {
		info := &process.ProcessInfo{Pid: uint32(pi.Pid), Config: &process.ProcessConfig{Cmd: pi.Config.Cmd, Args: pi.Config.Args, Envs: pi.Config.Env}}
		if pi.Config.Cwd != "" {
			cwd := pi.Config.Cwd
			info.Config.Cwd = &cwd
		}
		if pi.Tag != "" {
			tag := pi.Tag
			info.Tag = &tag
		}
		res.Processes = append(res.Processes, info)
	}
	return connect.NewResponse(res), nil
}

// sendInput writes one ProcessInput (stdin or pty bytes) to sel.
func (p *processService) sendInput(ctx context.Context, sel app.ProcessSelector, in *process.ProcessInput) error {
	var data []byte
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		data = v.Stdin
	case *process.ProcessInput_Pty:
		data = v.Pty
	default:
		return rpcErrorf(connect.CodeUnimplemented, "input is empty: send input.stdin or input.pty")
	}
	if len(data) == 0 {
		return nil
	}
	args := app.ProcessInputInput{ProcessSelector: sel, DataBase64: base64.StdEncoding.EncodeToString(data)}
	if _, err := invoke[*app.ProcessDone](ctx, p.s, "send_process_input", args); err != nil {
		return rpcError(err)
	}
	return nil
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	sel, err := selector(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.sendInput(ctx, sel, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (p *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var sel *app.ProcessSelector
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			s, err := selector(ctx, ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			sel = &s
		case *process.StreamInputRequest_Data:
			if sel == nil {
				return nil, rpcErrorf(connect.CodeInvalidArgument, "the input stream must begin with a start event naming the process")
			}
			if err := p.sendInput(ctx, *sel, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (p *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	sel, err := selector(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var name string
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		name = "SIGKILL"
	case process.Signal_SIGNAL_SIGTERM:
		name = "SIGTERM"
	default:
		// envd's answer to a signal it does not send.
		return nil, rpcErrorf(connect.CodeUnimplemented, "signal "+req.Msg.GetSignal().String()+": send SIGNAL_SIGTERM or SIGNAL_SIGKILL")
	}
	in := app.SignalProcessInput{ProcessSelector: sel, Signal: name}
	if _, err := invoke[*app.ProcessDone](ctx, p.s, "signal_process", in); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	sel, err := selector(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if _, err := invoke[*app.ProcessDone](ctx, p.s, "close_process_stdin", sel); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (p *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	sel, err := selector(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if pt := req.Msg.GetPty(); pt != nil {
		in := app.ResizeProcessInput{ProcessSelector: sel, Cols: int(pt.GetSize().GetCols()), Rows: int(pt.GetSize().GetRows())}
		if _, err := invoke[*app.ProcessDone](ctx, p.s, "resize_process", in); err != nil {
			return nil, rpcError(err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}
