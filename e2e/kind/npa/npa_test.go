package npa

import (
	"bytes"
	"context"
	"errors"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/network-policy-api/conformance"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/config"
	"sigs.k8s.io/network-policy-api/conformance/utils/kubernetes"
)

// render executes the manifests' template as the suite's applier does,
// with the default host-network ports, and parses each object.
func render(t *testing.T, manifests string) []map[string]any {
	t.Helper()
	tmpl, err := template.New("base").Parse(manifests)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	data := kubernetes.TemplateData{HostNetworkPorts: []int{34345, 34346, 34347, 34348, 34349, 34350, 34351, 34352}}
	if err := tmpl.Execute(&buf, data); err != nil {
		t.Fatal(err)
	}
	var objs []map[string]any
	dec := yaml.NewYAMLOrJSONDecoder(&buf, 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatal(err)
		}
		if obj != nil {
			objs = append(objs, obj)
		}
	}
}

func containers(obj map[string]any) []any {
	spec, _ := obj["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	podSpec, _ := tmpl["spec"].(map[string]any)
	c, _ := podSpec["containers"].([]any)
	return c
}

// sctpServer is the stripping's rule read from the parsed container:
// agnhost porter told to serve SCTP.
func sctpServer(c any) bool {
	m := c.(map[string]any)
	cmd, _ := m["command"].([]any)
	porter := len(cmd) > 0 && cmd[len(cmd)-1] == "/agnhost porter"
	env, _ := m["env"].([]any)
	for _, e := range env {
		if name, _ := e.(map[string]any)["name"].(string); porter && strings.HasPrefix(name, "SERVE_SCTP_PORT_") {
			return true
		}
	}
	return false
}

// TestStripSCTPServers: the stripped manifests, rendered, are upstream's
// with every SCTP porter container gone and nothing else changed.
func TestStripSCTPServers(t *testing.T) {
	orig, err := conformance.Manifests.ReadFile(BaseManifests)
	if err != nil {
		t.Fatal(err)
	}
	stripped, err := StrippedBaseManifests()
	if err != nil {
		t.Fatal(err)
	}
	want, got := render(t, string(orig)), render(t, stripped)
	if len(got) != len(want) {
		t.Fatalf("%d objects, upstream has %d", len(got), len(want))
	}
	removed := 0
	for i, obj := range want {
		kept := slices.DeleteFunc(slices.Clone(containers(obj)), sctpServer)
		removed += len(containers(obj)) - len(kept)
		if c := containers(obj); c != nil {
			if len(kept) == 0 {
				t.Errorf("%v: every container would go", obj["metadata"])
			}
			obj["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"] = kept
		}
		if !reflect.DeepEqual(got[i], obj) {
			t.Errorf("object %d differs beyond its SCTP servers:\ngot  %v\nwant %v", i, got[i], obj)
		}
	}
	// Five StatefulSets, two SCTP servers each, in v0.3.0.
	if removed != 10 {
		t.Errorf("removed %d SCTP server containers, want 10", removed)
	}
	if strings.Contains(stripped, "porter") || strings.Contains(stripped, "SERVE_SCTP") {
		t.Error("a porter or SCTP server line is left")
	}
}

func TestStripSCTPServersRefusesNothingToStrip(t *testing.T) {
	if _, err := StripSCTPServers("kind: Namespace\n"); err == nil {
		t.Error("manifests without SCTP servers were accepted")
	}
}

// TestSkipList: the skipped tests are exactly the upstream tests whose
// source makes an SCTP probe, and each exists in the suite.
func TestSkipList(t *testing.T) {
	registered := map[string]bool{}
	for _, ct := range tests.ConformanceTests {
		registered[ct.ShortName] = true
	}
	for name := range SkipReasons {
		if !registered[name] {
			t.Errorf("skipped test %s is not in the suite", name)
		}
	}
	// Each test's ShortName precedes its Test function in its file: a
	// probe belongs to the last ShortName before it.
	shortName := regexp.MustCompile(`ShortName:\s*"([^"]+)"|PokeServer\([^)]*?"sctp"`)
	entries, err := conformance.Manifests.ReadDir("tests")
	if err != nil {
		t.Fatal(err)
	}
	probing := map[string]bool{}
	for _, e := range entries {
		src, err := conformance.Manifests.ReadFile("tests/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		last := ""
		for _, m := range shortName.FindAllStringSubmatch(string(src), -1) {
			if m[1] != "" {
				last = m[1]
			} else if last == "" {
				t.Errorf("%s: an SCTP probe before any test", e.Name())
			} else {
				probing[last] = true
			}
		}
	}
	for name := range probing {
		if _, ok := SkipReasons[name]; !ok {
			t.Errorf("%s probes SCTP but is not skipped", name)
		}
	}
	for name := range SkipReasons {
		if !probing[name] {
			t.Errorf("%s is skipped but makes no SCTP probe", name)
		}
	}
}

// TestApplierTakesServedManifests: upstream's applier, as the suite's
// Setup calls it, fetches the stripped manifests from the test server with
// the default client, renders them and creates every object.
func TestApplierTakesServedManifests(t *testing.T) {
	stripped, err := StrippedBaseManifests()
	if err != nil {
		t.Fatal(err)
	}
	url, stop := ServeTLS(stripped)
	defer stop()
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).Build()
	a := kubernetes.Applier{HostNetworkPorts: []int{34345, 34346, 34347, 34348, 34349, 34350, 34351, 34352}}
	a.MustApplyWithCleanup(t, c, config.DefaultTimeoutConfig(), url, false)

	var sets appsv1.StatefulSetList
	if err := c.List(context.Background(), &sets); err != nil {
		t.Fatal(err)
	}
	if len(sets.Items) != 5 {
		t.Fatalf("%d StatefulSets created, want 5", len(sets.Items))
	}
	for _, s := range sets.Items {
		for _, ctr := range s.Spec.Template.Spec.Containers {
			if strings.Contains(strings.Join(ctr.Command, " "), "porter") {
				t.Errorf("%s/%s still runs porter", s.Name, ctr.Name)
			}
		}
	}
	var centaur appsv1.StatefulSet
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "network-policy-conformance-forbidden-forrest", Name: "centaur"}, &centaur); err != nil {
		t.Fatal(err)
	}
	if got := centaur.Spec.Template.Spec.Containers[1].Name; got != "centaur-34345-tcp" {
		t.Errorf("centaur's first server is %q: the template was not rendered", got)
	}
}
