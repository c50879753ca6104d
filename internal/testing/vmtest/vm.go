package vmtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// NIC attaches one virtual network card of the VM to a tap device inside a
// namespace. The guest names the cards eth0, eth1, … in the order given.
type NIC struct {
	Netns *Netns
	Tap   string // tap device name inside Netns, at most 15 bytes
	MAC   string // optional; QEMU picks one when empty
	// Bridge, when set, is a bridge in Netns (see Netns.AddBridge) the tap
	// joins, so that the VM shares one network with several addresses
	// of the namespace that exist before the VM starts.
	Bridge string
}

// Config describes a VM.
type Config struct {
	Image string // raw disk image; never modified (QEMU runs with -snapshot)
	NICs  []NIC
	// SerialLog is the file receiving the serial console (ttyS0). Input
	// goes through a pipe (see Shell).
	SerialLog string
	MemoryMB  int // default 1024
	// CPUs is the number of virtual CPUs, default 1. Under emulation on
	// a busy host two vCPUs wait on each other: with the host loaded
	// the guest kernel stalled in early boot for minutes with 2, and
	// booted in 46 s with 1. Override with NFTGATE_VMTEST_CPUS (a race
	// between CPUs needs two).
	CPUs int
	// Accel is QEMU's -accel value. Default "tcg,thread=multi": /dev/kvm
	// on the build machines does not run guests. Override with the
	// NFTGATE_VMTEST_ACCEL environment variable (e.g. "kvm").
	Accel string
	// Icount is QEMU's -icount value, e.g. "shift=0,sleep=on": the guest's
	// clock then advances by the instructions it executes while it runs
	// (2^shift ns each), so its busy CPU time counts its instructions,
	// whatever else the host is doing (TestApplianceFlowtable's CPU per
	// gigabyte, TestApplianceConnectionCost's per connection). It runs TCG
	// on one thread, which the default Accel then is. Override with the
	// NFTGATE_VMTEST_ICOUNT environment variable; empty is off.
	Icount string
	// UEFI boots through OVMF instead of the legacy BIOS (slower).
	UEFI bool
	// QEMU is the emulator binary; default qemu-system-x86_64.
	QEMU string
}

// setDefaults fills what cfg leaves empty, from the environment (getenv)
// where a variable names it.
func (cfg *Config) setDefaults(getenv func(string) string) error {
	if cfg.MemoryMB == 0 {
		cfg.MemoryMB = 1024
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = 1
		if v := getenv("NFTGATE_VMTEST_CPUS"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return fmt.Errorf("vmtest: NFTGATE_VMTEST_CPUS=%q: want a number of vCPUs, 1 or more", v)
			}
			cfg.CPUs = n
		}
	}
	if cfg.Icount == "" {
		cfg.Icount = getenv("NFTGATE_VMTEST_ICOUNT")
	}
	if cfg.Accel == "" {
		cfg.Accel = getenv("NFTGATE_VMTEST_ACCEL")
	}
	if cfg.Accel == "" {
		cfg.Accel = "tcg,thread=multi"
		if cfg.Icount != "" {
			// QEMU counts instructions only with one TCG thread.
			cfg.Accel = "tcg,thread=single"
		}
	}
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	return nil
}

// VM is a running QEMU process.
type VM struct {
	cfg     Config
	cmd     *exec.Cmd
	Started time.Time
	done    chan struct{}
	waitErr error
	qemuLog *os.File

	shellMu     sync.Mutex
	shellSeq    int
	serialInput *os.File // the serial console's input
}

// Start launches QEMU. The VM is killed if the test process dies, and Stop
// ends it.
func Start(cfg Config) (*VM, error) {
	if err := cfg.setDefaults(os.Getenv); err != nil {
		return nil, err
	}
	if cfg.SerialLog == "" {
		return nil, errors.New("vmtest: Config.SerialLog must be set")
	}
	if _, err := os.Stat(cfg.Image); err != nil {
		return nil, fmt.Errorf("vmtest: image: %w", err)
	}

	args := []string{
		"-name", "nftgate-vmtest",
		"-nodefaults", "-display", "none", "-monitor", "none",
		"-accel", cfg.Accel,
		"-m", fmt.Sprint(cfg.MemoryMB),
		"-smp", fmt.Sprint(cfg.CPUs),
		"-drive", "file=" + cfg.Image + ",format=raw",
		"-snapshot",
		// The serial console on QEMU's stdin and stdout: stdout is the
		// log file itself, so the guest never waits for a reader, and
		// stdin is a pipe that Shell writes to.
		"-chardev", "stdio,id=serial0,signal=off",
		"-serial", "chardev:serial0",
		// gokrazy pets this watchdog; a hung guest resets like real hardware.
		"-device", "i6300esb",
	}
	if cfg.Icount != "" {
		args = append(args, "-icount", cfg.Icount)
	}
	if cfg.UEFI {
		args = append(args,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
			// -snapshot keeps the firmware variables from being written back.
			"-drive", "if=pflash,format=raw,unit=1,file=/usr/share/OVMF/OVMF_VARS_4M.fd")
	}

	var taps []*os.File
	closeTaps := func() {
		for _, f := range taps {
			f.Close()
		}
	}
	for i, nic := range cfg.NICs {
		f, err := nic.Netns.openTap(nic.Tap)
		if err != nil {
			closeTaps()
			return nil, err
		}
		taps = append(taps, f)
		if nic.Bridge != "" {
			if err := nic.Netns.SetMaster(nic.Tap, nic.Bridge); err != nil {
				closeTaps()
				return nil, err
			}
		}
		// ExtraFiles[i] becomes descriptor 3+i in QEMU.
		args = append(args, "-netdev", fmt.Sprintf("tap,id=net%d,fd=%d", i, 3+i))
		dev := fmt.Sprintf("e1000,netdev=net%d", i)
		if nic.MAC != "" {
			dev += ",mac=" + nic.MAC
		}
		args = append(args, "-device", dev)
	}

	qemuLog, err := os.Create(cfg.SerialLog + ".qemu")
	if err != nil {
		closeTaps()
		return nil, err
	}
	serialLog, err := os.Create(cfg.SerialLog)
	if err != nil {
		closeTaps()
		qemuLog.Close()
		return nil, err
	}
	serialIn, serialInput, err := os.Pipe()
	if err != nil {
		closeTaps()
		qemuLog.Close()
		serialLog.Close()
		return nil, err
	}
	cmd := exec.Command(cfg.QEMU, args...)
	cmd.ExtraFiles = taps
	cmd.Stdin = serialIn
	cmd.Stdout = serialLog
	cmd.Stderr = qemuLog
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	vm := &VM{cfg: cfg, cmd: cmd, done: make(chan struct{}), qemuLog: qemuLog, serialInput: serialInput}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the forking OS thread exits, not the
		// process, and Go ends threads that a goroutine left locked.
		// Holding this thread until QEMU exits keeps the signal for
		// when the test process really dies.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		vm.Started = time.Now()
		started <- nil
		vm.waitErr = cmd.Wait()
		qemuLog.Close()
		serialInput.Close()
		close(vm.done)
	}()
	err = <-started
	// QEMU holds the taps and its ends of the console now; once it exits
	// the taps disappear.
	closeTaps()
	serialIn.Close()
	serialLog.Close()
	if err != nil {
		qemuLog.Close()
		serialInput.Close()
		return nil, fmt.Errorf("starting %s: %w", cfg.QEMU, err)
	}
	return vm, nil
}

// Done is closed when QEMU has exited.
func (vm *VM) Done() <-chan struct{} { return vm.done }

// Stop ends QEMU: SIGTERM, then SIGKILL if it has not exited in 10 s.
func (vm *VM) Stop() error {
	select {
	case <-vm.done:
		return nil
	default:
	}
	vm.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-vm.done:
		return nil
	case <-time.After(10 * time.Second):
	}
	vm.cmd.Process.Kill()
	<-vm.done
	return errors.New("vmtest: QEMU ignored SIGTERM and was killed")
}

// Kill ends QEMU at once with SIGKILL, as pulling the box's power cord:
// the guest says nothing more to anyone, and its taps disappear with QEMU.
// It returns when QEMU has exited.
func (vm *VM) Kill() {
	select {
	case <-vm.done:
		return
	default:
	}
	vm.cmd.Process.Kill()
	<-vm.done
}

// Console returns the last n bytes of the serial console and QEMU's own
// output, for failure messages.
func (vm *VM) Console(n int64) string {
	var b strings.Builder
	for _, p := range []string{vm.cfg.SerialLog, vm.cfg.SerialLog + ".qemu"} {
		f, err := os.Open(p)
		if err != nil {
			fmt.Fprintf(&b, "[%s: %v]\n", p, err)
			continue
		}
		if st, err := f.Stat(); err == nil && st.Size() > n {
			f.Seek(st.Size()-n, io.SeekStart)
		}
		data, _ := io.ReadAll(f)
		f.Close()
		fmt.Fprintf(&b, "--- %s (tail) ---\n%s\n", p, data)
	}
	return b.String()
}

// HTTPCheck decides whether a response is the one WaitHTTP waits for.
type HTTPCheck func(status int, body string) error

// WaitHTTP requests url through client until check accepts a response, QEMU
// exits or ctx ends. It returns the accepted body. user and password, when
// user is non-empty, are sent as basic auth.
func (vm *VM) WaitHTTP(ctx context.Context, client *http.Client, url, user, password string, check HTTPCheck) (string, error) {
	var last error
	retry := time.NewTicker(250 * time.Millisecond)
	defer retry.Stop()
	for {
		body, err := get(ctx, client, url, user, password, check)
		if err == nil {
			return body, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s did not answer as expected: %w (last attempt: %v)", url, ctx.Err(), last)
		case <-vm.done:
			return "", fmt.Errorf("QEMU exited (%v) before %s answered (last attempt: %v)", vm.waitErr, url, last)
		case <-retry.C:
		}
	}
}

func get(ctx context.Context, client *http.Client, url, user, password string, check HTTPCheck) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if err := check(resp.StatusCode, string(b)); err != nil {
		return "", err
	}
	return string(b), nil
}

// WaitConsole waits until the serial console, from byte offset from on,
// contains want, and returns the offset just past the match, so that a
// caller can wait for the next occurrence (after a reboot) from there.
func (vm *VM) WaitConsole(ctx context.Context, from int64, want string) (int64, error) {
	retry := time.NewTicker(200 * time.Millisecond)
	defer retry.Stop()
	for {
		b, err := os.ReadFile(vm.cfg.SerialLog)
		if err != nil {
			return 0, err
		}
		if from < int64(len(b)) {
			if i := strings.Index(string(b[from:]), want); i >= 0 {
				return from + int64(i+len(want)), nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("console never showed %q: %w", want, ctx.Err())
		case <-vm.done:
			return 0, fmt.Errorf("QEMU exited (%v) before the console showed %q", vm.waitErr, want)
		case <-retry.C:
		}
	}
}

// Shell runs a command line in the busybox shell that gokrazy starts on the
// serial console upon input (the image includes serial-busybox), and
// returns its output with the line endings the tty added removed. Output
// of the kernel or of gokrazy's own logs that lands on the console at the
// same time is included too; callers pick out the lines they expect.
func (vm *VM) Shell(ctx context.Context, cmdline string) (string, error) {
	vm.shellMu.Lock()
	defer vm.shellMu.Unlock()
	for {
		// The markers are written split in the command so that the
		// tty's echo of the typed line never matches them.
		vm.shellSeq++
		begin := fmt.Sprintf("@@vmtest-begin-%d@@", vm.shellSeq)
		end := fmt.Sprintf("@@vmtest-end-%d@@", vm.shellSeq)
		split := func(m string) string { return m[:4] + "''" + m[4:] }
		from := vm.consoleSize()
		line := fmt.Sprintf("\necho %s; %s; echo %s\n", split(begin), cmdline, split(end))
		if _, err := io.WriteString(vm.serialInput, line); err != nil {
			return "", fmt.Errorf("serial console: %w", err)
		}
		// The first input only starts the shell, and the line may be
		// lost until its prompt: it is sent again, with new markers,
		// when the shell has not started it within a few seconds.
		wait, cancel := context.WithTimeout(ctx, 5*time.Second)
		start, err := vm.WaitConsole(wait, from, begin)
		cancel()
		if err == nil {
			stop, err := vm.WaitConsole(ctx, start, end)
			if err != nil {
				return "", err
			}
			b, err := os.ReadFile(vm.cfg.SerialLog)
			if err != nil {
				return "", err
			}
			out := strings.ReplaceAll(string(b[start:stop-int64(len(end))]), "\r", "")
			return strings.TrimSpace(out), nil
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("serial shell never ran %q: %w", cmdline, ctx.Err())
		}
		select {
		case <-vm.done:
			return "", fmt.Errorf("QEMU exited (%v) before the serial shell answered", vm.waitErr)
		default:
		}
	}
}

func (vm *VM) consoleSize() int64 {
	st, err := os.Stat(vm.cfg.SerialLog)
	if err != nil {
		return 0
	}
	return st.Size()
}
