//go:build conformance

package npa

import (
	"os"
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	k8s "k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/yaml"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/flags"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

// TestClusterNetworkPolicyConformance runs the upstream suite with
// upstream's flags (--conformance-profiles, --supported-features,
// --organization, ..., --report-output; the cluster from --kubeconfig or
// KUBECONFIG) and writes its ConformanceReport. Two differences from
// upstream's TestConformanceProfiles, both for a kernel without SCTP: the
// base manifests lack their SCTP servers, served from this process, and
// the tests probing SCTP are skipped through the suite's SkipTests, which
// the report records as skipped (go test -skip would record them as
// passed).
func TestClusterNetworkPolicyConformance(t *testing.T) {
	profiles := suite.ParseConformanceProfiles(*flags.ConformanceProfiles)
	if profiles.Len() == 0 {
		t.Fatal("--conformance-profiles is required (ClusterNetworkPolicy)")
	}
	impl, err := suite.ParseImplementation(*flags.ImplementationOrganization, *flags.ImplementationProject,
		*flags.ImplementationURL, *flags.ImplementationVersion, *flags.ImplementationContact,
		*flags.ImplementationAdditionalInformation)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.GetConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(c.Scheme()); err != nil {
		t.Fatal(err)
	}
	clientSet, err := k8s.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	manifests, err := StrippedBaseManifests()
	if err != nil {
		t.Fatal(err)
	}
	url, stop := ServeTLS(manifests)
	defer stop()
	t.Logf("base manifests: upstream's %s less its agnhost porter SCTP server containers, served at %s", BaseManifests, url)
	var skip []string
	for name := range SkipReasons {
		skip = append(skip, name)
	}
	slices.Sort(skip)
	for _, name := range skip {
		t.Logf("skipping %s (no SCTP in this kernel): %s", name, SkipReasons[name])
	}

	s, err := suite.NewConformanceProfileTestSuite(suite.ConformanceProfileOptions{
		Options: suite.Options{
			Client:                     c,
			ClientSet:                  clientSet,
			KubeConfig:                 *cfg,
			Debug:                      *flags.ShowDebug,
			BaseManifests:              url,
			CleanupBaseResources:       *flags.CleanupBaseResources,
			SupportedFeatures:          suite.ParseSupportedFeatures(*flags.SupportedFeatures),
			ExemptFeatures:             suite.ParseSupportedFeatures(*flags.ExemptFeatures),
			EnableAllSupportedFeatures: *flags.EnableAllSupportedFeatures,
			SkipTests:                  skip,
		},
		Implementation:      *impl,
		ConformanceProfiles: profiles,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Setup(t)
	if err := s.Run(t, tests.ConformanceTests); err != nil {
		t.Fatal(err)
	}
	report, err := s.Report()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := yaml.Marshal(report)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("conformance report:\n%s", raw)
	if *flags.ReportOutput != "" {
		if err := os.WriteFile(*flags.ReportOutput, raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
