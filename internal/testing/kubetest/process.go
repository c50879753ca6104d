package kubetest

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// process is one server of the control plane: etcd or kube-apiserver.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	// done is closed when the process has exited and been reaped; err then
	// holds its exit status.
	done chan struct{}
	err  error
}

// startProcess runs bin with args, inside the network namespace at nsPath
// when it is set, appending its output to logPath.
//
// The namespace is entered with nsenter, which execs the server in place:
// the pid we hold is the server's own, and the process tree looks the same
// as `ip netns exec` would leave it.
func startProcess(name, nsPath, logPath string, bin string, args []string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))

	argv := append([]string{bin}, args...)
	if nsPath != "" {
		argv = append([]string{"nsenter", "--net=" + nsPath, "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// A test binary that dies (a timeout panic, a kill) takes its
		// servers with it instead of leaving them running.
		Pdeathsig: syscall.SIGKILL,
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the forking OS thread exits, not the test
		// process, and Go ends a thread that a goroutine left locked (as
		// network namespace code does on purpose). Holding this thread
		// until the server exits keeps the signal for a real death.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop asks the process to exit (SIGTERM) and kills it when it has not
// exited within grace. It returns once the process is reaped.
func (p *process) stop(grace time.Duration) error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !p.exited() {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
	}
	if err := p.cmd.Process.Kill(); err != nil && !p.exited() {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	<-p.done
	return nil
}

// logTail returns the last lines of a log file, for error messages.
func logTail(path string, lines int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const maxBytes = 16 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > maxBytes {
		if _, err := f.Seek(-maxBytes, io.SeekEnd); err != nil {
			return fmt.Sprintf("(log: %v)", err)
		}
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(log: %v)", err)
	}
	all := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return string(bytes.Join(all, []byte("\n")))
}
