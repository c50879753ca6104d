package e2e_test

import (
	"testing"

	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
)

// TestMain builds nftgate once for every test here (gatewaytest.Binary)
// and removes it afterwards.
func TestMain(m *testing.M) { gatewaytest.Main(m) }
