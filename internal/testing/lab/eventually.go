package lab

import (
	"context"
	"fmt"
	"time"
)

// Eventually calls fn until it returns nil or ctx is done. Between attempts
// it waits 10 ms, doubling up to 200 ms. When ctx ends first it returns an
// error that wraps fn's last error, so IsRefused and IsTimeout still classify
// the final attempt.
func Eventually(ctx context.Context, fn func() error) error {
	delay := 10 * time.Millisecond
	attempts := 0
	for {
		attempts++
		err := fn()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("lab: condition not met after %d attempts (%v): %w", attempts, ctx.Err(), err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("lab: condition not met after %d attempts (%v): %w", attempts, ctx.Err(), err)
		case <-t.C:
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// EventuallyWithin is Eventually with a deadline timeout from now.
func EventuallyWithin(timeout time.Duration, fn func() error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return Eventually(ctx, fn)
}
