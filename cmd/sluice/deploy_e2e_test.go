//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

// The deployment in deploy/ (issue 15), against the test suite's real API
// server with authorization on: every kustomization builds with
// kustomize's own library and passes a server-side dry run; the base is
// applied; then sluice runs as the DaemonSet's pod would, from the
// manifests themselves: the container's command line, its environment,
// the ConfigMap's files at their mount path, the ServiceAccount's token
// and CA where the kubelet puts them, and only the capabilities the
// container is given (a private mount namespace holds the pod's view; the
// test's private network namespace is its host network).

const deployDir = "../../deploy"

var deployKustomizations = []string{"base", "overlays/iptables", "overlays/nftables", "overlays/ipvs"}

// kustomizeBuild is `kubectl kustomize dir`.
func kustomizeBuild(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(deployDir, dir))
	if err != nil {
		t.Fatalf("kustomize build deploy/%s: %v", dir, err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range m.Resources() {
		obj, err := r.Map()
		if err != nil {
			t.Fatalf("deploy/%s: %v", dir, err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: obj})
	}
	return objs
}

func findObj(t *testing.T, objs []*unstructured.Unstructured, kind, name string, into any) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			if into != nil {
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
					t.Fatalf("%s %s: %v", kind, name, err)
				}
			}
			return o
		}
	}
	t.Fatalf("no %s %s in the build", kind, name)
	return nil
}

// ssaClient is `kubectl apply --server-side` through the dynamic client.
type ssaClient struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func (a *ssaClient) apply(ctx context.Context, o *unstructured.Unstructured, dryRun bool) error {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if ns := o.GetNamespace(); ns != "" {
		ri = a.dyn.Resource(m.Resource).Namespace(ns)
	}
	opts := metav1.ApplyOptions{FieldManager: "sluice-deploy-test", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	if _, err := ri.Apply(ctx, o.GetName(), o, opts); err != nil {
		return fmt.Errorf("%s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err)
	}
	return nil
}

func TestDeployWithRBAC(t *testing.T) {
	if !inPrivateNetns() {
		kubetest.Require(t, errors.New("the deploy test needs a private network namespace, which needs root"))
	}
	for _, bin := range []string{"unshare", "setpriv", "mount"} {
		if _, err := exec.LookPath(bin); err != nil {
			kubetest.Require(t, fmt.Errorf("the deploy test runs sluice in a pod's view with util-linux's %s: %w", bin, err))
		}
	}
	c := startCluster(t, kubetest.WithRBAC())
	ctx := context.Background()
	// A node routes the service range somewhere (its default route); the
	// test's namespace has only lo, so a veth pair that leads nowhere
	// stands in for the node's uplink.
	nodeUplink(t, "sluice-node", []string{"route", "add", kubetest.ServiceCIDR, "dev", "sluice-node0"})
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	a := &ssaClient{dyn: dynamic.NewForConfigOrDie(rc),
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Client.Discovery()))}

	// Every overlay is what a server accepts (kubectl apply --dry-run=server),
	// and its config.conf is a configuration sluice accepts.
	for _, dir := range deployKustomizations {
		objs := kustomizeBuild(t, dir)
		for _, o := range objs {
			if err := a.apply(ctx, o, true); err != nil {
				t.Errorf("deploy/%s, server-side dry run: %v", dir, err)
			}
		}
		var cm corev1.ConfigMap
		findObj(t, objs, "ConfigMap", "sluice", &cm)
		file := filepath.Join(t.TempDir(), "config.conf")
		os.WriteFile(file, []byte(cm.Data["config.conf"]), 0o600)
		if cfg, _, err := config.Parse([]string{"--config=" + file}); err != nil {
			t.Errorf("deploy/%s: sluice refuses its config.conf: %v", dir, err)
		} else if len(cfg.ConfigWarnings) > 0 {
			t.Errorf("deploy/%s: config.conf decodes with warnings: %v", dir, cfg.ConfigWarnings)
		}
	}

	// Install the base as the README says: the API server's address goes
	// into kubeconfig.conf.
	objs := kustomizeBuild(t, "base")
	cmObj := findObj(t, objs, "ConfigMap", "sluice", nil)
	kc, _, _ := unstructured.NestedString(cmObj.Object, "data", "kubeconfig.conf")
	if !strings.Contains(kc, "https://CONTROL_PLANE_ENDPOINT:6443") {
		t.Fatalf("kubeconfig.conf has no CONTROL_PLANE_ENDPOINT to set:\n%s", kc)
	}
	unstructured.SetNestedField(cmObj.Object, strings.ReplaceAll(kc, "https://CONTROL_PLANE_ENDPOINT:6443", c.URL), "data", "kubeconfig.conf")
	for _, o := range objs {
		if err := a.apply(ctx, o, false); err != nil {
			t.Fatal(err)
		}
	}
	var ds appsv1.DaemonSet
	findObj(t, objs, "DaemonSet", "sluice", &ds)
	var cm corev1.ConfigMap
	findObj(t, objs, "ConfigMap", "sluice", &cm)
	var sa corev1.ServiceAccount
	findObj(t, objs, "ServiceAccount", "sluice", &sa)

	ca, err := c.CA()
	if err != nil {
		t.Fatal(err)
	}
	podOf := func(t *testing.T, ds *appsv1.DaemonSet, cm *corev1.ConfigMap) *proc {
		ns, name := ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName
		tok, err := c.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("TokenRequest for %s/%s: %v", ns, name, err)
		}
		return runAsPod(t, ds, cm.Data, map[string]string{"token": tok.Status.Token, "ca.crt": string(ca), "namespace": ns})
	}
	pod := func(t *testing.T) *proc { return podOf(t, &ds, &cm) }
	if sa.Name != ds.Spec.Template.Spec.ServiceAccountName {
		t.Fatalf("the DaemonSet runs as %q, the ServiceAccount is %q", ds.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}

	t.Run("serves", func(t *testing.T) {
		p := pod(t)
		logs := keepLog(t, p)
		e := &kubeEnv{t: t, cluster: c, client: c.Client}
		e.eventually("the deployed sluice's initial sync", func() (bool, string) {
			return logs.find("initial list of Services and EndpointSlices synced") != "", logs.tail(5)
		})
		e.backend("10.244.0.21", "deploy-a")
		svc := e.createService(webService("deployed"))
		e.setSlice("deployed", "deployed-1", "http", readyEP("10.244.0.21"))
		e.eventually("NodePort through the deployed sluice", backendsAre(nodePort(svc, "http"), 3, "deploy-a"))
		ip := svc.Spec.ClusterIP
		e.eventually("ClusterIP through the deployed sluice", func() (bool, string) {
			body, err := getURL("http://" + ip + ":80/")
			return err == nil && body == "deploy-a", fmt.Sprint(body, err)
		})
		if code, _ := status(t, "http://127.0.0.1:10256/healthz"); code != 200 {
			t.Errorf("readiness probe /healthz: %d", code)
		}
		if code, _ := status(t, "http://127.0.0.1:10256/livez"); code != 200 {
			t.Errorf("liveness probe /livez: %d", code)
		}
		// The container asks for SYS_RESOURCE to set oom_score_adj as
		// kube-proxy does; where the test itself lacks it (this CI's
		// container), the warning must say so, and nothing else may warn.
		const oomWarn = "default oom-score-adj not applied"
		if hostHasCap(t, capSysResource) == (logs.find(oomWarn) != "") {
			t.Errorf("SYS_RESOURCE held: %v; oom-score-adj warning: %q", hostHasCap(t, capSysResource), logs.find(oomWarn))
		}
		for _, bad := range []string{"forbidden", "Forbidden", "level=ERROR", "level=WARN", "permission denied", "operation not permitted"} {
			if l := logs.findExcept(bad, oomWarn); l != "" {
				t.Errorf("the deployed sluice logged %q: %s", bad, l)
			}
		}
	})

	// Without NET_ADMIN the VIP capture cannot work, and sluice says so:
	// the capability list above is checked, not decoration.
	t.Run("a missing capability is caught", func(t *testing.T) {
		less := ds.DeepCopy()
		sc := less.Spec.Template.Spec.Containers[0].SecurityContext
		sc.Capabilities.Add = slices.DeleteFunc(sc.Capabilities.Add, func(c corev1.Capability) bool { return c == "NET_ADMIN" })
		p := podOf(t, less, &cm)
		p.waitLog("level=WARN", "userspace VIP capture: none")
	})

	// A kernel-mode overlay's pod: privileged, iptables mode from its
	// config.conf, serving a Service created afterwards.
	t.Run("the iptables overlay's pod", func(t *testing.T) {
		objs := kustomizeBuild(t, "overlays/iptables")
		var ods appsv1.DaemonSet
		findObj(t, objs, "DaemonSet", "sluice", &ods)
		var ocm corev1.ConfigMap
		findObj(t, objs, "ConfigMap", "sluice", &ocm)
		ocm.Data["kubeconfig.conf"] = strings.ReplaceAll(ocm.Data["kubeconfig.conf"], "https://CONTROL_PLANE_ENDPOINT:6443", c.URL)
		if sc := ods.Spec.Template.Spec.Containers[0].SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
			t.Fatal("the iptables overlay's container is not privileged")
		}
		p := podOf(t, &ods, &ocm)
		logs := keepLog(t, p)
		e := &kubeEnv{t: t, cluster: c, client: c.Client}
		e.eventually("iptables mode from the overlay's config", func() (bool, string) {
			return logs.find("iptables mode") != "", logs.tail(5)
		})
		e.backend("10.244.0.23", "overlay-a")
		svc := e.createService(webService("overlaid"))
		e.setSlice("overlaid", "overlaid-1", "http", readyEP("10.244.0.23"))
		ip := svc.Spec.ClusterIP
		e.eventually("ClusterIP through the iptables overlay's pod", func() (bool, string) {
			body, err := getURL("http://" + ip + ":80/")
			return err == nil && body == "overlay-a", fmt.Sprint(body, err)
		})
		if l := logs.find("orbidden"); l != "" {
			t.Errorf("the overlay's pod logged: %s", l)
		}
		p.cmd.Process.Signal(os.Interrupt)
		p.exitCode()
		exec.Command(sluiceBin, "--cleanup").Run()
	})

	// Swap in place: kubeadm's own kube-proxy DaemonSet, ConfigMap and
	// ServiceAccount, unchanged, run sluice at kube-proxy's path (what
	// `kubectl set image daemonset/kube-proxy` gives a node).
	t.Run("kubeadm's kube-proxy pod", func(t *testing.T) {
		data, err := os.ReadFile("testdata/kubeadm-kube-proxy.yaml")
		if err != nil {
			t.Fatal(err)
		}
		var kds appsv1.DaemonSet
		var kcm corev1.ConfigMap
		for _, doc := range strings.Split(string(data), "\n---\n") {
			o := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &o.Object); err != nil {
				t.Fatal(err)
			}
			if o.GetKind() == "ConfigMap" {
				kc, _, _ := unstructured.NestedString(o.Object, "data", "kubeconfig.conf")
				unstructured.SetNestedField(o.Object, strings.ReplaceAll(kc, "https://CONTROL_PLANE_ENDPOINT:6443", c.URL), "data", "kubeconfig.conf")
			}
			if err := a.apply(ctx, o, false); err != nil {
				t.Fatal(err)
			}
			switch o.GetKind() {
			case "DaemonSet":
				findObj(t, []*unstructured.Unstructured{o}, "DaemonSet", "kube-proxy", &kds)
			case "ConfigMap":
				findObj(t, []*unstructured.Unstructured{o}, "ConfigMap", "kube-proxy", &kcm)
			}
		}
		p := podOf(t, &kds, &kcm)
		logs := keepLog(t, p)
		e := &kubeEnv{t: t, cluster: c, client: c.Client}
		e.backend("10.244.0.22", "kubeadm-a")
		svc := e.createService(webService("swapped"))
		e.setSlice("swapped", "swapped-1", "http", readyEP("10.244.0.22"))
		e.eventually("NodePort through sluice as kube-proxy", backendsAre(nodePort(svc, "http"), 3, "kubeadm-a"))
		if l := logs.find("orbidden"); l != "" {
			t.Errorf("sluice as kube-proxy logged: %s", l)
		}
	})

	// The same run with one rule fewer than system:node-proxier grants
	// (EndpointSlices) is caught: the check above can fail.
	t.Run("a missing rule is caught", func(t *testing.T) {
		full, err := c.Client.RbacV1().ClusterRoles().Get(ctx, "system:node-proxier", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		reduced := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "sluice-test-reduced"}}
		dropped := false
		for _, r := range full.Rules {
			if len(r.Resources) == 1 && r.Resources[0] == "endpointslices" {
				dropped = true
				continue
			}
			reduced.Rules = append(reduced.Rules, r)
		}
		if !dropped {
			t.Fatalf("system:node-proxier has no rule of its own for endpointslices: %+v", full.Rules)
		}
		if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, reduced, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var crb rbacv1.ClusterRoleBinding
		findObj(t, objs, "ClusterRoleBinding", "sluice-node-proxier", &crb)
		if err := c.Client.RbacV1().ClusterRoleBindings().Delete(ctx, crb.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		crb.ResourceVersion = ""
		crb.RoleRef.Name = reduced.Name
		if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &crb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := pod(t)
		p.waitLog("endpointslices", "forbidden")
	})
}

// runAsPod starts sluice as a DaemonSet's container: its command and
// arguments with $(VAR) expanded from its environment, the ConfigMap's
// files at the config volume's mount path, the service account's files
// where the kubelet mounts them, /proc/sys read-only as a container
// runtime mounts it for an unprivileged container, and no capability but
// those the container adds. The test's built binary stands at the
// command's path.
func runAsPod(t *testing.T, ds *appsv1.DaemonSet, files, saFiles map[string]string) *proc {
	t.Helper()
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Fatal("the DaemonSet does not use the host's network")
	}
	ctr := spec.Containers[0]
	env := map[string]string{}
	for _, ev := range ctr.Env {
		switch {
		case ev.ValueFrom != nil && ev.ValueFrom.FieldRef != nil && ev.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			env[ev.Name] = kubeNode
		case ev.ValueFrom == nil:
			env[ev.Name] = ev.Value
		default:
			t.Fatalf("env %s: a source this test does not model", ev.Name)
		}
	}
	argv := append(append([]string{}, ctr.Command...), ctr.Args...)
	for i, a := range argv {
		for k, v := range env {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		argv[i] = a
	}
	cfgMount := ""
	for _, vm := range ctr.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil {
				cfgMount = vm.MountPath
			}
		}
	}
	if cfgMount == "" {
		t.Fatal("the DaemonSet mounts no ConfigMap")
	}
	// A privileged container keeps every capability and a writable
	// /proc/sys; any other loses all but those it adds.
	bounding, procSys := "+all", "rw"
	if sc := ctr.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		bounding, procSys = "-all", "ro"
		if sc != nil && sc.Capabilities != nil {
			for _, c := range sc.Capabilities.Add {
				bounding += ",+" + strings.ToLower(string(c))
			}
		}
	}
	dir := t.TempDir()
	write := func(sub string, m map[string]string) string {
		d := filepath.Join(dir, sub)
		os.MkdirAll(d, 0o755)
		for name, data := range m {
			if err := os.WriteFile(filepath.Join(d, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	cfgDir, saDir := write("config", files), write("sa", saFiles)
	binDir := filepath.Dir(argv[0])
	script := `set -e
mount -t tmpfs tmpfs "$BIN_DIR" && cp "$SLUICE_BIN" "$CMD"
if [ -d "$CFG_MOUNT" ]; then mount -t tmpfs tmpfs "$CFG_MOUNT"; else mount -t tmpfs tmpfs "$(dirname "$CFG_MOUNT")"; mkdir -p "$CFG_MOUNT"; fi
cp "$CFG_DIR"/* "$CFG_MOUNT"/
mount -t tmpfs tmpfs /run
mkdir -p /run/secrets/kubernetes.io/serviceaccount && cp "$SA_DIR"/* /run/secrets/kubernetes.io/serviceaccount/
mount --bind /proc/sys /proc/sys && mount -o remount,bind,"$PROC_SYS" /proc/sys
exec setpriv --bounding-set="$BOUNDING" --inh-caps=-all --no-new-privs -- "$@"`
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"}, argv...)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"BIN_DIR=" + binDir, "SLUICE_BIN=" + sluiceBin, "CMD=" + argv[0], "CFG_MOUNT=" + cfgMount,
		"CFG_DIR=" + cfgDir, "SA_DIR=" + saDir, "BOUNDING=" + bounding, "PROC_SYS=" + procSys}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	t.Logf("as the pod: %s (capabilities %s)", strings.Join(argv, " "), bounding)
	return startCmd(t, cmd)
}

// nodeUplink gives the test's namespace a node's uplink: a veth pair
// name0/name1 that leads nowhere, up, then each of the ip commands in
// then (an address, a route); it is deleted when the test ends.
func nodeUplink(t *testing.T, name string, then ...[]string) {
	t.Helper()
	ip := func(args ...string) error {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := ip("link", "add", name+"0", "type", "veth", "peer", "name", name+"1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ip("link", "del", name+"0") })
	errs := []error{ip("link", "set", name+"0", "up"), ip("link", "set", name+"1", "up")}
	for _, args := range then {
		errs = append(errs, ip(args...))
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// keepLog keeps p's log lines from now on and shows their tail if the test
// fails.
func keepLog(t *testing.T, p *proc) *lineLog { return keepLogOf(t, p, "sluice") }

// keepLogOf is keepLog for a process named name in the failure.
func keepLogOf(t *testing.T, p *proc, name string) *lineLog {
	logs := &lineLog{}
	go logs.drain(p.lines)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", name, logs.tail(60))
		}
	})
	return logs
}

// find returns the first kept line containing s.
func (l *lineLog) find(s string) string { return l.findExcept(s, "\x00") }

// findExcept returns the first kept line containing s and not except.
func (l *lineLog) findExcept(s, except string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) && !strings.Contains(line, except) {
			return line
		}
	}
	return ""
}

const capSysResource = 24

// hostHasCap says whether this process's bounding set holds capability c
// (a container may run the tests without some).
func hostHasCap(t *testing.T, c uint) bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			bits, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return bits&(1<<c) != 0
		}
	}
	t.Fatal("no CapBnd in /proc/self/status")
	return false
}

// getURL is one GET on a new connection.
func getURL(url string) (string, error) {
	resp, err := (&http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
