//go:build linux

// Package kubetest owns the test bed of a real Kubernetes control plane:
// etcd (Debian's etcd-server) and a kube-apiserver built from the Go module
// proxy (scripts/build-kube.sh), started on free loopback ports
// with a generated token and kubeconfig, and stopped by PID when the test
// ends. Tests import it, and so does the bench harness (for endpoint churn
// through a real API server), through a TB of its own.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// APIServerVersion is the kube-apiserver the tests run.
const APIServerVersion = "v1.34.2"

// ServiceCIDR is the cluster IP range the API server allocates from.
const ServiceCIDR = "10.96.0.0/16"

// Cluster is a running etcd plus kube-apiserver.
type Cluster struct {
	Kubeconfig string // path of a kubeconfig with a system:masters token
	Client     kubernetes.Interface
	URL        string

	t         TB
	dir       string
	apiserver string
	apiArgs   []string
	api       *exec.Cmd
	apiDone   chan struct{}
	token     string
	drawn     map[int]bool   // the ports freePort handed out
	claim     func(int) bool // the caller's record of ports handed out (ClaimPorts)
}

// Option changes how Start configures the API server.
type Option func(*options)

type options struct {
	rbac, dualStack bool
	claim           func(int) bool
}

// ServiceCIDR6 is the IPv6 cluster IP range of a dual-stack API server
// (WithDualStack).
const ServiceCIDR6 = "fd00:96::/112"

// WithDualStack makes the API server dual-stack: it allocates IPv6 cluster
// IPs from ServiceCIDR6 beside the IPv4 ones.
func WithDualStack() Option { return func(o *options) { o.dualStack = true } }

// WithRBAC turns authorization on as a real cluster has it (Node,RBAC,
// with the bootstrap roles such as system:node-proxier); the Cluster's own
// client stays a system:masters member.
func WithRBAC() Option { return func(o *options) { o.rbac = true } }

// ClaimPorts makes the ports drawn for etcd and kube-apiserver go through
// claim too, the caller's record of the ports it hands out (FreePort's
// claim): a port is free when drawn and bound only later, so a test
// process that draws ports of its own could otherwise hand out one that
// etcd is about to bind, or the reverse.
func ClaimPorts(claim func(port int) bool) Option { return func(o *options) { o.claim = claim } }

// CA returns the PEM of the CA that signed the API server's serving
// certificate (kube-apiserver generates both under its --cert-dir), which
// is what a pod's ca.crt holds in a real cluster.
func (c *Cluster) CA() ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(c.dir, "certs", "apiserver.crt"))
	if err != nil {
		return nil, err
	}
	var last []byte
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		last = pem.EncodeToMemory(b)
	}
	if last == nil {
		return nil, fmt.Errorf("no certificate in %s/certs/apiserver.crt", c.dir)
	}
	return last, nil // the file holds the serving certificate, then its CA
}

// KubeProxyBinary finds upstream kube-proxy (the same version as the API
// server), the reference the nftables parity test runs sluice beside:
// $SLUICE_KUBE_PROXY or the build cache (scripts/build-kube.sh kube-proxy).
func KubeProxyBinary() (string, error) {
	bin := os.Getenv("SLUICE_KUBE_PROXY")
	if bin == "" {
		cache := os.Getenv("SLUICE_CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "sluice")
		}
		bin = filepath.Join(cache, "kube-proxy-"+APIServerVersion)
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("kube-proxy %s not found at %s: run `make test-deps` (scripts/build-kube.sh kube-proxy builds it, ~7 minutes cold)", APIServerVersion, bin)
	}
	return bin, nil
}

// Binaries finds etcd and kube-apiserver: $SLUICE_KUBE_APISERVER or the
// build cache (~/.cache/sluice/kube-apiserver-VERSION), and etcd on PATH.
// The message says how to get what is missing.
func Binaries() (etcd, apiserver string, err error) {
	apiserver = os.Getenv("SLUICE_KUBE_APISERVER")
	if apiserver == "" {
		cache := os.Getenv("SLUICE_CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "sluice")
		}
		apiserver = filepath.Join(cache, "kube-apiserver-"+APIServerVersion)
	}
	if _, err := os.Stat(apiserver); err != nil {
		return "", "", fmt.Errorf("kube-apiserver %s not found at %s: run `make test-deps` (scripts/build-kube.sh builds it, ~7 minutes cold)", APIServerVersion, apiserver)
	}
	etcd, err = exec.LookPath("etcd")
	if err != nil {
		return "", "", fmt.Errorf("etcd not found on PATH: run `make test-deps` (apt-get install etcd-server)")
	}
	return etcd, apiserver, nil
}

// Require fails the test under CI=true, and skips it otherwise, when err is
// not nil: a missing privileged test bed is a failure in CI.
func Require(t TB, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: %v", err)
	}
	t.Skip(err)
}

// freePort is a TCP port for etcd and kube-apiserver (FreePort), none
// drawn twice by c, nor handed out by the caller's claim.
func (c *Cluster) freePort() int {
	return FreePort(c.t, "tcp", func(port int) bool {
		if c.drawn[port] || c.claim != nil && !c.claim(port) {
			return false
		}
		if c.drawn == nil {
			c.drawn = map[int]bool{}
		}
		c.drawn[port] = true
		return true
	})
}

// Start runs etcd and kube-apiserver until the test ends and waits until
// the API server is ready. Their logs go to files in the test's temp dir,
// and are printed if the test fails.
func Start(t TB, opts ...Option) *Cluster {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	authz := "AlwaysAllow"
	if o.rbac {
		authz = "Node,RBAC"
	}
	serviceCIDRs := ServiceCIDR
	if o.dualStack {
		serviceCIDRs += "," + ServiceCIDR6
	}
	etcdBin, apiBin, err := Binaries()
	Require(t, err)
	dir := t.TempDir()
	c := &Cluster{t: t, dir: dir, apiserver: apiBin, claim: o.claim}

	etcdClient, etcdPeer := c.freePort(), c.freePort()
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	c.startProc("etcd", etcdBin, "--data-dir", filepath.Join(dir, "etcd"), "--name", "sluice-test",
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPeer),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPeer),
		"--initial-cluster", fmt.Sprintf("sluice-test=http://127.0.0.1:%d", etcdPeer),
		"--log-level", "warn",
		// As kubeadm runs etcd: the API server's watch cache learns how far
		// etcd has got from these notifications when no event of its own
		// resource says so, and serves a watch from a newer resourceVersion
		// only once it knows (without them the watch waits and is refused:
		// "Too large resource version").
		"--experimental-watch-progress-notify-interval", "5s")

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	saKey := write("sa.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	saPub := write("sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	tok := make([]byte, 16)
	rand.Read(tok)
	c.token = hex.EncodeToString(tok)
	tokens := write("tokens.csv", []byte(c.token+",sluice-test,sluice-test,system:masters\n"))

	port := c.freePort()
	c.URL = fmt.Sprintf("https://127.0.0.1:%d", port)
	c.apiArgs = []string{"--etcd-servers=" + etcdURL, "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port),
		"--cert-dir=" + filepath.Join(dir, "certs"), "--service-account-key-file=" + saPub,
		"--service-account-signing-key-file=" + saKey, "--service-account-issuer=https://kubernetes.default.svc",
		"--token-auth-file=" + tokens, "--authorization-mode=" + authz, "--service-cluster-ip-range=" + serviceCIDRs,
		"--advertise-address=127.0.0.1", "--enable-priority-and-fairness=false", "--allow-privileged=true", "--v=0"}
	c.StartAPIServer()

	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: test
  user:
    token: %s
contexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
`, c.URL, c.token)
	c.Kubeconfig = write("kubeconfig", []byte(kc))
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c.Client = kubernetes.NewForConfigOrDie(rc)
	return c
}

// startProc starts a process that is killed by PID when the test ends.
func (c *Cluster) startProc(name, bin string, args ...string) (*exec.Cmd, chan struct{}) {
	logPath := filepath.Join(c.dir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test binary
	if err := cmd.Start(); err != nil {
		logf.Close()
		c.t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(done)
	}()
	c.t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if c.t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				c.t.Logf("%s log (tail):\n%s", name, tail(string(b), 40))
			}
		}
	})
	return cmd, done
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer) and
// waits until /readyz answers ok.
func (c *Cluster) StartAPIServer() {
	c.t.Helper()
	c.api, c.apiDone = c.startProc("kube-apiserver", c.apiserver, c.apiArgs...)
	if err := c.waitReady(90 * time.Second); err != nil {
		c.t.Fatalf("kube-apiserver: %v", err)
	}
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL) and waits for
// it to exit; etcd keeps running, so the state survives.
func (c *Cluster) StopAPIServer() {
	c.api.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.apiDone:
	case <-time.After(30 * time.Second):
		c.api.Process.Kill()
		<-c.apiDone
	}
}

func (c *Cluster) waitReady(timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", c.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		if resp, err := hc.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, tail(string(b), 5))
		} else {
			last = err.Error()
		}
		select {
		case <-c.apiDone:
			return fmt.Errorf("exited before it was ready (log in %s)", c.dir)
		case <-ctx.Done():
			return fmt.Errorf("not ready after %v: %s", timeout, last)
		case <-tick.C:
		}
	}
}
