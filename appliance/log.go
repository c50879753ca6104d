package appliance

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// LogLevels and LogFormats are the accepted values of NewLogger's arguments.
var (
	LogLevels  = []string{"debug", "info", "warn", "error"}
	LogFormats = []string{"text", "json"}
)

// NewLogger returns a logger writing to w at the given level (debug, info,
// warn or error) in the given format (text or json). Values are
// case-insensitive; an unknown one is an error naming it.
func NewLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	switch strings.ToLower(strings.TrimSpace(level)) {
	case "debug":
		lv = slog.LevelDebug
	case "info":
		lv = slog.LevelInfo
	case "warn", "warning":
		lv = slog.LevelWarn
	case "error":
		lv = slog.LevelError
	default:
		return nil, fmt.Errorf("log level %q: want one of %s", level, strings.Join(LogLevels, ", "))
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(strings.TrimSpace(format)) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want one of %s", format, strings.Join(LogFormats, ", "))
}
