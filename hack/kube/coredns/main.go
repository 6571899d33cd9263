// CoreDNS with only the plugins the node agents' Corefile uses (hack/rtj_dev/nodeagent.py: bind,
// errors, kubernetes), so a cold build compiles CoreDNS's core and its kubernetes plugin, not the
// cloud DNS plugins (route53, azure, clouddns) and their SDKs. hack/kube/build.sh builds it.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	"github.com/coredns/coredns/coremain"
)

func init() {
	// The order CoreDNS's own generated list gives these three (core/dnsserver/zdirectives.go).
	dnsserver.Directives = []string{"bind", "errors", "kubernetes"}
}

func main() {
	coremain.Run()
}
