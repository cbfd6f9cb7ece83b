//go:build linux

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

// The Kubernetes API source against a real kube-apiserver and etcd: objects
// are written with client-go and real traffic through the sluice binary
// must follow. Backends sit on pod-like addresses (10.244.0.x) on lo of the
// test's private network namespace; the API server refuses loopback ones.

const kubeNode = "node-a"

type kubeEnv struct {
	t       *testing.T
	cluster *kubetest.Cluster
	client  kubernetes.Interface
	metrics string // host:port of sluice's metrics server
	healthz string
	sluice  *proc
	logs    *lineLog
}

// startCluster is kubetest.Start with the ports of etcd and
// kube-apiserver drawn through this process's record too.
func startCluster(t *testing.T, opts ...kubetest.Option) *kubetest.Cluster {
	t.Helper()
	return kubetest.Start(t, append(opts, kubetest.ClaimPorts(drawPort))...)
}

// lineLog keeps sluice's log lines after start-up, so the pipe never fills
// and a failing test can show them.
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) drain(ch <-chan string) {
	for line := range ch {
		l.mu.Lock()
		l.lines = append(l.lines, line)
		l.mu.Unlock()
	}
}

func (l *lineLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	from := max(0, len(l.lines)-n)
	return strings.Join(l.lines[from:], "\n")
}

func startKubeEnv(t *testing.T) *kubeEnv {
	if !inPrivateNetns() {
		kubetest.Require(t, errors.New("the Kubernetes API tests need a private network namespace, which needs root"))
	}
	c := startCluster(t)
	e := &kubeEnv{t: t, cluster: c, client: c.Client}
	hz, mp := freePort(t, "tcp"), freePort(t, "tcp")
	e.healthz, e.metrics = fmt.Sprintf("127.0.0.1:%d", hz), fmt.Sprintf("127.0.0.1:%d", mp)
	e.sluice = start(t, "--kubeconfig", c.Kubeconfig, "--hostname-override", kubeNode, "--bind-address", "127.0.0.1",
		"--healthz-bind-address="+e.healthz, "--metrics-bind-address="+e.metrics,
		"--iptables-min-sync-period=0", "--kube-api-qps=50", "--kube-api-burst=100")
	e.sluice.waitLog("initial list of Services and EndpointSlices synced")
	e.logs = &lineLog{}
	go e.logs.drain(e.sluice.lines)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sluice log (tail):\n%s", e.logs.tail(60))
		}
	})
	return e
}

func (e *kubeEnv) ctx() context.Context { return context.Background() }

// backend serves its name over HTTP on ip:8080 (and UDP on ip:5353).
func (e *kubeEnv) backend(ip, name string) {
	e.t.Helper()
	if err := addLocalAddr(ip); err != nil {
		e.t.Fatal(err)
	}
	httpBackend(e.t, ip+":8080", name)
	udpBackend(e.t, ip+":5353", name)
}

type kubeEP struct {
	ip, node                    string
	ready, serving, terminating bool
	// forZones and forNodes are its topology hints (none when empty).
	forZones, forNodes []string
}

func readyEP(ip string) kubeEP { return kubeEP{ip: ip, node: kubeNode, ready: true, serving: true} }

func ptrTo[T any](v T) *T { return &v }

func (e *kubeEnv) createService(svc *corev1.Service) *corev1.Service {
	e.t.Helper()
	out, err := e.client.CoreV1().Services(svc.Namespace).Create(e.ctx(), svc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create Service %s: %v", svc.Name, err)
	}
	return out
}

func (e *kubeEnv) updateService(ns, name string, mut func(*corev1.Service)) *corev1.Service {
	e.t.Helper()
	svc, err := e.client.CoreV1().Services(ns).Get(e.ctx(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	mut(svc)
	out, err := e.client.CoreV1().Services(ns).Update(e.ctx(), svc, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatalf("update Service %s: %v", name, err)
	}
	return out
}

func webService(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
			{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(5353), Protocol: corev1.ProtocolUDP},
		}},
	}
}

// setSlice creates or replaces the slice named name of a Service, with
// ports named as the Service's ports are.
func (e *kubeEnv) setSlice(svc, name string, httpPortName string, eps ...kubeEP) {
	e.t.Helper()
	e.setSliceOf(svc, name, discoveryv1.AddressTypeIPv4, httpPortName, eps...)
}

// setSliceOf is setSlice for a slice of the given address type.
func (e *kubeEnv) setSliceOf(svc, name string, addressType discoveryv1.AddressType, httpPortName string, eps ...kubeEP) {
	e.t.Helper()
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: addressType,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptrTo(httpPortName), Port: ptrTo(int32(8080)), Protocol: ptrTo(corev1.ProtocolTCP)},
			{Name: ptrTo("dns"), Port: ptrTo(int32(5353)), Protocol: ptrTo(corev1.ProtocolUDP)},
		},
	}
	for _, ep := range eps {
		d := discoveryv1.Endpoint{Addresses: []string{ep.ip}, NodeName: ptrTo(ep.node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(ep.ready), Serving: ptrTo(ep.serving), Terminating: ptrTo(ep.terminating)}}
		if len(ep.forZones) > 0 || len(ep.forNodes) > 0 {
			d.Hints = &discoveryv1.EndpointHints{}
			for _, z := range ep.forZones {
				d.Hints.ForZones = append(d.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
			for _, n := range ep.forNodes {
				d.Hints.ForNodes = append(d.Hints.ForNodes, discoveryv1.ForNode{Name: n})
			}
		}
		sl.Endpoints = append(sl.Endpoints, d)
	}
	api := e.client.DiscoveryV1().EndpointSlices("default")
	old, err := api.Get(e.ctx(), name, metav1.GetOptions{})
	if err == nil {
		sl.ResourceVersion = old.ResourceVersion
		_, err = api.Update(e.ctx(), sl, metav1.UpdateOptions{})
	} else {
		_, err = api.Create(e.ctx(), sl, metav1.CreateOptions{})
	}
	if err != nil {
		e.t.Fatalf("write EndpointSlice %s: %v", name, err)
	}
}

func nodePort(svc *corev1.Service, name string) int {
	for _, p := range svc.Spec.Ports {
		if p.Name == name {
			return int(p.NodePort)
		}
	}
	return 0
}

// hit makes one request on a new connection and returns the backend's name.
func hit(port int) (string, error) {
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func hitUDP(port int) (string, error) {
	conn, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("ping")); err != nil {
		return "", err
	}
	buf := make([]byte, 1500)
	n, err := conn.Read(buf)
	if err != nil {
		return "", err
	}
	name, _, _ := strings.Cut(string(buf[:n]), ":")
	return name, nil
}

// spread makes n requests and returns the set of backends that answered,
// and the first error.
func spread(port, n int) (map[string]int, error) {
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		name, err := hit(port)
		if err != nil {
			return seen, err
		}
		seen[name]++
	}
	return seen, nil
}

// eventually polls cond until it holds, and logs how long the data plane
// took to follow the API write made just before (not asserted: a bound on
// a shared 2-core box would be a timing test). The 60 s limit is a safety
// net for a broken build, not a synchronisation.
func (e *kubeEnv) eventually(what string, cond func() (bool, string)) {
	e.t.Helper()
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		ok, state := cond()
		if ok {
			e.t.Logf("API write -> data plane: %s after %v", what, time.Since(start).Round(time.Millisecond))
			return
		}
		last = state
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: never happened; last state: %s", what, last)
		}
		<-tick.C
	}
}

func backendsAre(port, n int, want ...string) func() (bool, string) {
	return func() (bool, string) {
		seen, err := spread(port, n)
		if err != nil {
			return false, err.Error()
		}
		if len(seen) != len(want) {
			return false, fmt.Sprint(seen)
		}
		for _, w := range want {
			if seen[w] == 0 {
				return false, fmt.Sprint(seen)
			}
		}
		return true, ""
	}
}

// refused holds when a connection is actively refused or reset, not when
// it hangs: kube-proxy's e2e wants REFUSED, never a timeout.
func refused(port int) func() (bool, string) {
	return func() (bool, string) {
		name, err := hit(port)
		if err == nil {
			return false, "answered by " + name
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return false, "timed out instead of being refused: " + err.Error()
		}
		return true, ""
	}
}

func status(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (e *kubeEnv) metric(pattern string) string {
	e.t.Helper()
	body := get(e.t, "http://"+e.metrics+"/metrics")
	return regexp.MustCompile(pattern).FindString(body)
}

func TestKubeAPISource(t *testing.T) {
	e := startKubeEnv(t)
	for i, ip := range []string{"10.244.0.1", "10.244.0.2", "10.244.0.3"} {
		e.backend(ip, fmt.Sprintf("b%d", i+1))
	}
	var web *corev1.Service
	var np, unp int

	t.Run("new Service becomes reachable", func(t *testing.T) {
		web = e.createService(webService("web"))
		e.setSlice("web", "web-1", "http", readyEP("10.244.0.1"))
		np, unp = nodePort(web, "http"), nodePort(web, "dns")
		e.eventually("new Service reachable over TCP", backendsAre(np, 3, "b1"))
		e.eventually("new Service reachable over UDP", func() (bool, string) {
			name, err := hitUDP(unp)
			return err == nil && name == "b1", fmt.Sprint(name, err)
		})
	})

	t.Run("endpoints scale up and down", func(t *testing.T) {
		e.setSlice("web", "web-1", "http", readyEP("10.244.0.1"), readyEP("10.244.0.2"))
		e.setSlice("web", "web-2", "http", readyEP("10.244.0.3")) // a second slice is merged
		e.eventually("scaled up to three", backendsAre(np, 9, "b1", "b2", "b3"))
		e.setSlice("web", "web-1", "http", readyEP("10.244.0.2"))
		e.eventually("scaled down to two", backendsAre(np, 8, "b2", "b3"))
	})

	t.Run("not ready, then terminating", func(t *testing.T) {
		e.setSlice("web", "web-1", "http", kubeEP{ip: "10.244.0.2", node: kubeNode, serving: true})
		e.eventually("not-ready endpoint left out", backendsAre(np, 6, "b3"))
		// No ready endpoint left: the serving, terminating ones are used.
		e.setSlice("web", "web-2", "http", kubeEP{ip: "10.244.0.3", node: kubeNode, serving: true, terminating: true})
		e.setSlice("web", "web-1", "http", kubeEP{ip: "10.244.0.2", node: kubeNode, terminating: true})
		e.eventually("falls back to the serving terminating endpoint", backendsAre(np, 6, "b3"))
		e.setSlice("web", "web-2", "http", kubeEP{ip: "10.244.0.3", node: kubeNode, terminating: true})
		e.eventually("no serving endpoint: refused", refused(np))
		e.setSlice("web", "web-1", "http", readyEP("10.244.0.1"), readyEP("10.244.0.2"))
		e.setSlice("web", "web-2", "http", readyEP("10.244.0.3"))
		e.eventually("all ready again", backendsAre(np, 9, "b1", "b2", "b3"))
	})

	t.Run("session affinity ClientIP, None, ClientIP", func(t *testing.T) {
		sticky := func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptrTo(int32(300))}}
		}
		oneBackend := func() (bool, string) {
			seen, err := spread(np, 15) // e2e's 15 consecutive hits on one pod
			return err == nil && len(seen) == 1, fmt.Sprint(seen, err)
		}
		e.updateService("default", "web", sticky)
		e.eventually("ClientIP: one backend", oneBackend)
		e.updateService("default", "web", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityNone
			s.Spec.SessionAffinityConfig = nil
		})
		e.eventually("None: spread again", backendsAre(np, 9, "b1", "b2", "b3"))
		e.updateService("default", "web", sticky)
		e.eventually("ClientIP again: one backend", oneBackend)
		e.updateService("default", "web", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityNone
			s.Spec.SessionAffinityConfig = nil
		})
		e.eventually("None", backendsAre(np, 9, "b1", "b2", "b3"))
	})

	t.Run("port rename", func(t *testing.T) {
		e.updateService("default", "web", func(s *corev1.Service) { s.Spec.Ports[0].Name = "web" })
		e.setSlice("web", "web-1", "web", readyEP("10.244.0.1"), readyEP("10.244.0.2"))
		e.setSlice("web", "web-2", "web", readyEP("10.244.0.3"))
		e.eventually("renamed port serves", func() (bool, string) {
			dump := get(t, "http://"+e.metrics+"/debug/sluice")
			if !strings.Contains(dump, `"default/web:web"`) || strings.Contains(dump, `"default/web:http"`) {
				return false, "debug dump: " + dump
			}
			return backendsAre(np, 9, "b1", "b2", "b3")()
		})
	})

	t.Run("Services kube-proxy must ignore", func(t *testing.T) {
		for _, label := range []string{"service.kubernetes.io/service-proxy-name", "service.kubernetes.io/headless"} {
			svc := webService("ignored-" + strings.ReplaceAll(strings.Split(label, "/")[1], "-", ""))
			svc.Labels = map[string]string{label: "other"}
			svc = e.createService(svc)
			e.setSlice(svc.Name, svc.Name+"-1", "http", readyEP("10.244.0.1"))
		}
		// A marker Service written after them: once it serves, they were seen.
		marker := e.createService(webService("marker"))
		e.setSlice("marker", "marker-1", "http", readyEP("10.244.0.2"))
		e.eventually("marker served", backendsAre(nodePort(marker, "http"), 2, "b2"))
		dump := get(t, "http://"+e.metrics+"/debug/sluice")
		if strings.Contains(dump, "ignored") {
			t.Fatalf("a Service labelled for another proxy is served: %s", dump)
		}
	})

	t.Run("bad objects are skipped, counted, and hurt nothing else", func(t *testing.T) {
		e.setSlice("ghost", "ghost-1", "http", readyEP("10.244.0.1"))
		e.eventually("orphan slice counted", func() (bool, string) {
			m := e.metric(`sluice_rejected_updates_total\{object="EndpointSlice default/ghost-1",source="kubernetes"\} 1`)
			return m != "", "metric not found"
		})
		if seen, err := spread(np, 6); err != nil || len(seen) != 3 {
			t.Fatalf("web after a bad object: %v %v", seen, err)
		}
	})

	t.Run("traffic policy Local uses this node's endpoints", func(t *testing.T) {
		svc := webService("local")
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		svc = e.createService(svc)
		e.setSlice("local", "local-1", "http", readyEP("10.244.0.1"), kubeEP{ip: "10.244.0.2", node: "node-b", ready: true, serving: true})
		e.eventually("NodePort with externalTrafficPolicy Local: only node-a's endpoint", backendsAre(nodePort(svc, "http"), 6, "b1"))
	})

	t.Run("API server restart during traffic: no client errors", func(t *testing.T) {
		var stop atomic.Bool
		var requests, failures atomic.Int64
		var firstErr atomic.Value
		done := make(chan struct{})
		go func() {
			defer close(done)
			// Bounded: one new connection per 5 ms, so TIME_WAIT never
			// exhausts the ephemeral ports.
			pace := time.NewTicker(5 * time.Millisecond)
			defer pace.Stop()
			for !stop.Load() {
				<-pace.C
				requests.Add(1)
				if _, err := hit(np); err != nil {
					if failures.Add(1) == 1 {
						firstErr.Store(err.Error())
					}
				}
			}
		}()
		e.cluster.StopAPIServer()
		if code, body := status(t, "http://"+e.healthz+"/healthz"); code != 200 || !strings.Contains(body, `"nodeEligible":true`) {
			t.Errorf("healthz with the API server down: %d %s; want 200: nothing queued is waiting", code, body)
		}
		e.cluster.StartAPIServer()
		// The watch resumes: a change made after the restart takes effect.
		e.backend("10.244.0.4", "b4")
		e.setSlice("web", "web-2", "web", readyEP("10.244.0.3"), readyEP("10.244.0.4"))
		e.eventually("a change after the restart", backendsAre(np, 12, "b1", "b2", "b3", "b4"))
		stop.Store(true)
		<-done
		t.Logf("%d requests during the restart, %d failed", requests.Load(), failures.Load())
		if failures.Load() > 0 {
			t.Fatalf("%d of %d requests failed during the API server restart; first: %v", failures.Load(), requests.Load(), firstErr.Load())
		}
	})

	t.Run("deleted Service is refused", func(t *testing.T) {
		if err := e.client.CoreV1().Services("default").Delete(e.ctx(), "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.eventually("deleted Service refused", refused(np))
		e.eventually("deleted UDP port closed", func() (bool, string) {
			name, err := hitUDP(unp)
			return err != nil, "answered by " + name
		})
	})

	t.Run("healthz and metrics", func(t *testing.T) {
		var body map[string]any
		if err := json.Unmarshal([]byte(get(t, "http://"+e.healthz+"/healthz")), &body); err != nil || body["nodeEligible"] != true {
			t.Fatalf("healthz: %v %v", body, err)
		}
		if m := e.metric(`kubeproxy_sync_proxy_rules_last_timestamp_seconds\{ip_family=""\} \S+`); m == "" {
			t.Fatal("no sync timestamp metric")
		}
	})
}
