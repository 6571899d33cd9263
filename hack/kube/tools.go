//go:build tools

// Package tools pins the upstream Kubernetes control plane and etcd (at the version
// Kubernetes v1.37.2 itself requires) so `go build` can produce them from the module proxy.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
