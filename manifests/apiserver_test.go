//go:build privileged

package manifests

import (
	"context"
	"testing"

	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"

	"github.com/onc-net/onc/internal/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
)

// The API server accepts the DaemonSet and the Deployment as written (a
// dry run: this API server has no kubelets). It rejects, for example, a
// Bidirectional mount in a container that is not privileged.
func TestWorkloadsPassTheAPIServer(t *testing.T) {
	api := testutil.KubeAPIServer(t, etcdtest.Embedded(t, "").ClientURL)
	ctx := context.Background()
	if err := Apply(ctx, api.RESTConfig(), NotWorkloads); err != nil {
		t.Fatal(err)
	}
	workloads := func(u *unstructured.Unstructured) bool { return !NotWorkloads(u) }
	opts := metav1.PatchOptions{FieldManager: "onc", Force: ptr.To(true), DryRun: []string{metav1.DryRunAll}}
	if err := apply(ctx, api.RESTConfig(), workloads, opts); err != nil {
		t.Fatal(err)
	}
}
