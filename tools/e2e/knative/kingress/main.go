// kingress: the e2e cluster's KIngress implementation (test infrastructure, never shipped).
//
// Knative Serving leaves the data path in front of revisions to a networking layer (Kourier, Contour,
// Istio, ...); none of them can be built here, so the e2e cluster runs this small one. It watches
// ingresses.networking.internal.knative.dev of its class, routes requests by host, path prefix and exact
// header matches, picks a traffic split by its percentage, sets the headers the spec appends (the
// activator needs Knative-Serving-Revision and Knative-Serving-Namespace), and reverse-proxies to the
// split's Service by its cluster DNS name. It runs as a host process on the node, like the cluster's
// CoreDNS: one listener for external visibility (the public load balancer, an IP) and one for cluster
// visibility (the private load balancer, a selector-less Service whose endpoint is this process), and
// reports both in each Ingress's status with Ready once its routes are live.
//
// Not implemented (the conformance suite's other parts): TLS, HTTP/2 and gRPC towards backends, retries,
// timeouts, tags.
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"knative.dev/networking/pkg/apis/networking"
	"knative.dev/networking/pkg/apis/networking/v1alpha1"
	clientset "knative.dev/networking/pkg/client/clientset/versioned"
	informers "knative.dev/networking/pkg/client/informers/externalversions"
	listers "knative.dev/networking/pkg/client/listers/networking/v1alpha1"
	"knative.dev/networking/pkg/http/header"
	"knative.dev/networking/pkg/ingress"
)

type options struct {
	kubeconfig    string
	class         string
	publicAddr    string
	privateAddr   string
	publicIP      string
	privateDomain string
	dnsAddr       string
	clusterDomain string
}

// split is one weighted backend of a path.
type split struct {
	target  string // host:port of the backend Service
	percent int
	headers map[string]string
}

// path is one HTTPIngressPath: a prefix, exact header matches, and the splits it sends to.
type path struct {
	prefix      string
	match       map[string]string
	rewriteHost string
	headers     map[string]string
	splits      []split
	total       int
	hash        string // the Ingress's config hash, sent on a probe that asks for it (K-Network-Hash: override)
}

// table maps a lower-case host to its paths, in the order the Ingress lists them (first match wins).
type table map[string][]*path

type tables struct {
	public  table // ExternalIP rules only
	private table // every rule: in-cluster callers reach external routes too
}

type controller struct {
	opts    options
	lister  listers.IngressLister
	client  clientset.Interface
	current atomic.Pointer[tables]
	wake    chan struct{}
}

func main() {
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster")
	flag.StringVar(&o.class, "ingress-class", "kingress.e2e.sessionmem.local", "the ingress class served")
	flag.StringVar(&o.publicAddr, "public-addr", "10.244.0.1:80", "listener for external visibility")
	flag.StringVar(&o.privateAddr, "private-addr", "10.244.0.1:8081", "listener for cluster visibility")
	flag.StringVar(&o.publicIP, "public-ip", "10.244.0.1", "the public load balancer's IP, as reported")
	flag.StringVar(&o.privateDomain, "private-domain", "kingress-private.knative-serving.svc.cluster.local",
		"the private load balancer's Service, as reported")
	flag.StringVar(&o.dnsAddr, "dns", "10.244.0.1:53", "the cluster DNS server, for backends' Service names")
	flag.StringVar(&o.clusterDomain, "cluster-domain", "cluster.local", "the cluster's DNS domain")
	flag.Parse()
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

func run(o options) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	client, err := clientset.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	factory := informers.NewSharedInformerFactory(client, 10*time.Minute)
	informer := factory.Networking().V1alpha1().Ingresses()
	c := &controller{opts: o, lister: informer.Lister(), client: client, wake: make(chan struct{}, 1)}
	c.current.Store(&tables{public: table{}, private: table{}})
	poke := func(any) { c.poke() }
	if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    poke,
		UpdateFunc: func(_, obj any) { poke(obj) },
		DeleteFunc: poke,
	}); err != nil {
		return err
	}

	servers := []*http.Server{c.server(o.publicAddr, false), c.server(o.privateAddr, true)}
	errs := make(chan error, len(servers))
	for _, s := range servers {
		listener, err := net.Listen("tcp", s.Addr)
		if err != nil {
			return err
		}
		go func() { errs <- s.Serve(listener) }()
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	log.Printf("kingress: class %s, public %s, private %s", o.class, o.publicAddr, o.privateAddr)
	go c.loop(ctx)

	select {
	case <-ctx.Done():
	case err := <-errs:
		return err
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(shutdown)
	}
	return nil
}

func (c *controller) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// loop rebuilds the routing tables on every change, then reports the status of what is now live.
func (c *controller) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		if err := c.sync(ctx); err != nil {
			log.Printf("kingress: sync: %v (retrying)", err)
			time.AfterFunc(time.Second, c.poke)
		}
	}
}

func (c *controller) ours(ing *v1alpha1.Ingress) bool {
	return ing.Annotations[networking.IngressClassAnnotationKey] == c.opts.class && ing.DeletionTimestamp == nil
}

func (c *controller) sync(ctx context.Context) error {
	all, err := c.lister.List(labels.Everything())
	if err != nil {
		return err
	}
	var served []*v1alpha1.Ingress
	for _, ing := range all {
		if c.ours(ing) {
			served = append(served, ing)
		}
	}
	// Oldest first, so a host claimed by two Ingresses keeps going to the first one.
	sort.Slice(served, func(i, j int) bool {
		a, b := served[i], served[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	next := &tables{public: table{}, private: table{}}
	for _, ing := range served {
		c.add(next, ing)
	}
	c.current.Store(next)

	var errs []error
	for _, ing := range served {
		if err := c.report(ctx, ing); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *controller) add(t *tables, ing *v1alpha1.Ingress) {
	sum, err := ingress.ComputeHash(ing)
	if err != nil {
		log.Printf("kingress: %s/%s: %v", ing.Namespace, ing.Name, err)
	}
	hash := hex.EncodeToString(sum[:])
	for _, rule := range ing.Spec.Rules {
		if rule.HTTP == nil {
			continue
		}
		var paths []*path
		for _, p := range rule.HTTP.Paths {
			compiled := &path{prefix: p.Path, rewriteHost: p.RewriteHost, headers: p.AppendHeaders,
				match: map[string]string{}, hash: hash}
			for name, m := range p.Headers {
				compiled.match[name] = m.Exact
			}
			for _, s := range p.Splits {
				port := s.ServicePort.IntValue()
				if s.ServicePort.Type == intstr.String || port == 0 {
					log.Printf("kingress: %s/%s: named service port %q is not supported", ing.Namespace, ing.Name,
						s.ServicePort.String())
					continue
				}
				percent := s.Percent
				if len(p.Splits) == 1 && percent == 0 {
					percent = 100 // a lone split may leave its percentage unset
				}
				target := fmt.Sprintf("%s.%s.svc.%s:%d", s.ServiceName, s.ServiceNamespace, c.opts.clusterDomain, port)
				compiled.splits = append(compiled.splits, split{target: target, percent: percent, headers: s.AppendHeaders})
				compiled.total += percent
			}
			paths = append(paths, compiled)
		}
		for _, host := range rule.Hosts {
			host = strings.ToLower(host)
			if rule.Visibility != v1alpha1.IngressVisibilityClusterLocal {
				t.public[host] = append(t.public[host], paths...)
			}
			t.private[host] = append(t.private[host], paths...)
		}
	}
}

// report marks the Ingress Ready for its generation, with both load balancers, unless it already is.
func (c *controller) report(ctx context.Context, ing *v1alpha1.Ingress) error {
	desired := ing.DeepCopy()
	desired.Status.InitializeConditions()
	desired.Status.MarkNetworkConfigured()
	desired.Status.MarkLoadBalancerReady(
		[]v1alpha1.LoadBalancerIngressStatus{{IP: c.opts.publicIP}},
		[]v1alpha1.LoadBalancerIngressStatus{{DomainInternal: c.opts.privateDomain}},
	)
	desired.Status.ObservedGeneration = ing.Generation
	if ing.Status.ObservedGeneration == ing.Generation && ing.IsReady() &&
		equality.Semantic.DeepEqual(ing.Status.PublicLoadBalancer, desired.Status.PublicLoadBalancer) &&
		equality.Semantic.DeepEqual(ing.Status.PrivateLoadBalancer, desired.Status.PrivateLoadBalancer) {
		return nil
	}
	_, err := c.client.NetworkingV1alpha1().Ingresses(ing.Namespace).UpdateStatus(ctx, desired, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("status of %s/%s: %w", ing.Namespace, ing.Name, err)
	}
	return nil
}

func (c *controller) server(addr string, private bool) *http.Server {
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, c.opts.dnsAddr)
	}}
	dialer := &net.Dialer{Timeout: 5 * time.Second, Resolver: resolver}
	transport := &http.Transport{
		DialContext:           refusedRetrying(dialer),
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // a cold start through the activator takes what it takes
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			chosen := r.In.Context().Value(routeKey{}).(*choice)
			r.SetXForwarded()
			r.Out.URL.Scheme = "http"
			r.Out.URL.Host = chosen.split.target
			r.Out.Host = r.In.Host
			if chosen.path.rewriteHost != "" {
				r.Out.Host = chosen.path.rewriteHost
			}
			for name, value := range chosen.path.headers {
				r.Out.Header.Set(name, value)
			}
			for name, value := range chosen.split.headers {
				r.Out.Header.Set(name, value)
			}
			if r.In.Header.Get(header.ProbeKey) == header.ProbeValue &&
				r.In.Header.Get(header.HashKey) == header.HashValueOverride {
				r.Out.Header.Set(header.HashKey, chosen.path.hash)
			}
		},
		Transport:     transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Printf("kingress: %s %s%s: %v", r.Method, r.Host, r.URL.Path, err)
			http.Error(w, "kingress: upstream unavailable", http.StatusServiceUnavailable)
		},
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := c.current.Load()
		routes := t.public
		if private {
			routes = t.private
		}
		chosen := pick(routes, r)
		if chosen == nil {
			http.Error(w, "kingress: no route for this host and path", http.StatusNotFound)
			return
		}
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, chosen)))
	})
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // the route's Service names its port h2c
	return &http.Server{Addr: addr, Handler: handler, Protocols: protocols, ReadHeaderTimeout: 30 * time.Second,
		ErrorLog: log.New(os.Stderr, "kingress: ", log.LstdFlags)}
}

// refusedRetrying retries a refused connection for a few seconds: a Service created a moment ago may not
// be in kube-proxy's rules yet, and a refused dial sent nothing, so trying again is safe.
func refusedRetrying(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		deadline := time.Now().Add(5 * time.Second)
		for {
			conn, err := d.DialContext(ctx, network, addr)
			if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
				return conn, err
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

type routeKey struct{}

type choice struct {
	path  *path
	split split
}

func pick(routes table, r *http.Request) *choice {
	host := strings.ToLower(r.Host)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	for _, p := range routes[host] {
		if !strings.HasPrefix(r.URL.Path, p.prefix) || len(p.splits) == 0 {
			continue
		}
		matched := true
		for name, value := range p.match {
			if r.Header.Get(name) != value {
				matched = false
				break
			}
		}
		if !matched {
			continue
		}
		return &choice{path: p, split: weighted(p)}
	}
	return nil
}

// weighted picks a split with probability percent/total.
func weighted(p *path) split {
	if p.total <= 0 {
		return p.splits[0]
	}
	n := rand.IntN(p.total)
	for _, s := range p.splits {
		if n < s.percent {
			return s
		}
		n -= s.percent
	}
	return p.splits[len(p.splits)-1]
}
