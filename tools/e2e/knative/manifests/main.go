// manifests: Knative Serving's release manifests for the e2e cluster, from the module zips the build
// already downloaded (knative.dev/serving's config/core, and the CRDs it takes from knative.dev/networking
// and knative.dev/caching, which the serving repository links in and a module zip leaves out).
//
// It writes two YAML streams: CRDs (applied first, then waited for) and the rest, with
//   - each ko://knative.dev/serving/cmd/<cmd> image replaced by the local image named by -image <cmd>=<ref>;
//   - the components' requests lowered and their CPU limits dropped (a 2-core node shared with the tests);
//   - no HorizontalPodAutoscaler or PodDisruptionBudget (one replica each, no metrics server);
//   - ConfigMap values set with -config <configmap>.<key>=<value> (ingress class, domain, ...);
//   - the webhook configurations last (they refuse what they check until the webhook runs).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

type pairs map[string]string

func (p pairs) String() string { return fmt.Sprint(map[string]string(p)) }
func (p pairs) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("%q is not key=value", v)
	}
	p[k] = val
	return nil
}

const koPrefix = "ko://knative.dev/serving/cmd/"

func main() {
	images, configs := pairs{}, pairs{}
	serving := flag.String("serving", "", "knative.dev/serving module directory")
	networking := flag.String("networking", "", "knative.dev/networking module directory")
	caching := flag.String("caching", "", "knative.dev/caching module directory")
	crdsOut := flag.String("crds", "", "output: the CRDs")
	restOut := flag.String("out", "", "output: everything else")
	cpu := flag.String("cpu-request", "10m", "CPU request of each component")
	memory := flag.String("memory-request", "40Mi", "memory request of each component")
	flag.Var(images, "image", "<cmd>=<image reference>, for each ko:// image")
	flag.Var(configs, "config", "<configmap>.<key>=<value>, set in the named ConfigMap's data")
	flag.Parse()

	var files []string
	err := filepath.WalkDir(filepath.Join(*serving, "config", "core"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	sort.Strings(files)
	for _, name := range []string{"certificate.yaml", "ingress.yaml", "serverlessservice.yaml", "domain-claim.yaml",
		"config-network.yaml"} {
		files = append(files, filepath.Join(*networking, "config", name))
	}
	files = append(files, filepath.Join(*caching, "config", "image.yaml"))

	var crds, rest, hooks bytes.Buffer
	used := map[string]bool{}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			log.Fatal(err)
		}
		for _, doc := range strings.Split(string(raw), "\n---") {
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				log.Fatalf("%s: %v", file, err)
			}
			if len(obj) == 0 {
				continue
			}
			kind, _ := obj["kind"].(string)
			if kind == "HorizontalPodAutoscaler" || kind == "PodDisruptionBudget" {
				continue
			}
			obj = substitute(obj, images).(map[string]any)
			if kind == "Deployment" {
				lower(obj, *cpu, *memory)
			}
			if kind == "ConfigMap" {
				name := obj["metadata"].(map[string]any)["name"].(string)
				data, _ := obj["data"].(map[string]any)
				if data == nil {
					data = map[string]any{}
				}
				for key, value := range configs {
					if cm, k, _ := strings.Cut(key, "."); cm == name {
						data[k] = value
						used[key] = true
					}
				}
				obj["data"] = data
			}
			out, err := yaml.Marshal(obj)
			if err != nil {
				log.Fatal(err)
			}
			target := &rest
			switch kind {
			case "CustomResourceDefinition":
				target = &crds
			case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
				// Last: until the webhook runs, they would refuse what follows them (the ConfigMaps).
				target = &hooks
			}
			target.WriteString("---\n")
			target.Write(out)
		}
	}
	for key := range configs {
		if !used[key] {
			log.Fatalf("-config %s: no such ConfigMap in the release", key)
		}
	}
	rest.Write(hooks.Bytes())
	if left := strings.Index(rest.String(), koPrefix); left >= 0 {
		log.Fatalf("an image was not substituted: %s", rest.String()[left:left+60])
	}
	for path, buf := range map[string]*bytes.Buffer{*crdsOut: &crds, *restOut: &rest} {
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

// substitute replaces every ko:// image string, wherever it appears.
func substitute(v any, images pairs) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = substitute(e, images)
		}
	case []any:
		for i, e := range t {
			t[i] = substitute(e, images)
		}
	case string:
		if cmd, ok := strings.CutPrefix(t, koPrefix); ok {
			image, known := images[cmd]
			if !known {
				log.Fatalf("no -image for %s", t)
			}
			return image
		}
	}
	return v
}

func lower(deployment map[string]any, cpu, memory string) {
	spec := deployment["spec"].(map[string]any)
	spec["replicas"] = 1
	pod := spec["template"].(map[string]any)["spec"].(map[string]any)
	delete(pod, "affinity") // anti-affinity across nodes means nothing on one node
	for _, c := range pod["containers"].([]any) {
		container := c.(map[string]any)
		resources, _ := container["resources"].(map[string]any)
		if resources == nil {
			continue
		}
		resources["requests"] = map[string]any{"cpu": cpu, "memory": memory}
		if limits, ok := resources["limits"].(map[string]any); ok {
			delete(limits, "cpu")
		}
	}
}
