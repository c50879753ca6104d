// Package e2e tests the nftgate binary from the outside: it is built once
// per test run (gatewaytest.Binary) and run in the gateway namespace of a
// lab, serving manifest files or a real kube-apiserver, with real TCP, UDP
// and SCTP traffic between the lab's client and backend namespaces, and its
// status page driven in headless Chromium. The package holds tests only.
package e2e
