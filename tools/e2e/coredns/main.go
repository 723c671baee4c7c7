// CoreDNS for the e2e cluster, with only the plugins its Corefile uses: the
// default build links every cloud DNS provider's SDK, which makes the build
// several times longer on a shared two-core machine for nothing a single-node
// cluster needs. The directive order stays CoreDNS's own (dnsserver.Directives).
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/whoami"
	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
