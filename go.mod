module github.com/sluice-proxy/sluice

go 1.26.8

require (
	github.com/fsnotify/fsnotify v1.9.0 // indirect
	github.com/prometheus/client_golang v1.22.0 // indirect
	github.com/spf13/pflag v1.0.6 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/sys v0.35.0 // indirect
	k8s.io/api v0.34.2 // indirect
	k8s.io/apimachinery v0.34.2 // indirect
	k8s.io/kube-proxy v0.34.2 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)
