// Package manifests carries onc.yaml, the one file that installs ONC on a
// cluster, so the tests apply exactly what users apply.
package manifests

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"
)

//go:embed onc.yaml
var oncYAML []byte

// Objects decodes onc.yaml.
func Objects() ([]*unstructured.Unstructured, error) {
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(oncYAML), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("onc.yaml: %w", err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// Apply server-side-applies the objects of onc.yaml for which keep returns
// true (all if nil), in file order, and waits for each CRD to be served.
func Apply(ctx context.Context, cfg *rest.Config, keep func(*unstructured.Unstructured) bool) error {
	return apply(ctx, cfg, keep, metav1.PatchOptions{FieldManager: "onc", Force: ptr.To(true)})
}

func apply(ctx context.Context, cfg *rest.Config, keep func(*unstructured.Unstructured) bool, opts metav1.PatchOptions) error {
	objs, err := Objects()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	for _, u := range objs {
		if keep != nil && !keep(u) {
			continue
		}
		m, err := mapper.RESTMapping(u.GroupVersionKind().GroupKind(), u.GroupVersionKind().Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		body, err := u.MarshalJSON()
		if err != nil {
			return err
		}
		if _, err := ri.Patch(ctx, u.GetName(), types.ApplyPatchType, body, opts); err != nil {
			return fmt.Errorf("applying %s %s: %w", u.GetKind(), u.GetName(), err)
		}
		if u.GetKind() == "CustomResourceDefinition" {
			if err := waitEstablished(ctx, ri, u.GetName()); err != nil {
				return err
			}
			mapper.Reset()
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, ri dynamic.ResourceInterface, name string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		u, err := ri.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		} else if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
}

// NotWorkloads selects everything but the Deployment and the DaemonSet: the
// namespace, CRD, RBAC and config, for API servers without kubelets (the
// tests' and the lab's).
func NotWorkloads(u *unstructured.Unstructured) bool {
	return u.GetKind() != "Deployment" && u.GetKind() != "DaemonSet"
}
