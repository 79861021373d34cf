// The upstream ClusterNetworkPolicy conformance tests (sigs.k8s.io/network-policy-api/conformance,
// its tests unmodified), run as the upstream conformance/conformance_test.go runs them: the same
// flags (--kubeconfig, --supported-features, --exempt-features, --all-features,
// --cleanup-base-resources, --debug), the same suite options, and `go test -run`/`-skip`
// choosing tests by their ShortName (TestConformance/CNPAdminTierGress).
//
// One difference, asked for by --sctp=false: on a kernel without SCTP the base pods' SCTP servers
// (`agnhost porter` with SERVE_SCTP_PORT_*) exit at once, so no base pod would ever be Ready and
// every test would fail in set-up. With --sctp=false the set-up is suite.Setup's, step for step,
// but with those containers left out of the base StatefulSets; every other container, namespace
// and label is as the suite's base/manifests.yaml makes it. Its SCTP probes would then fail, and
// each failure would end its case before the TCP and UDP probes after it: so scripts/cluster.sh
// build compiles the suite from a copy of the module whose PokeServer first asks
// overlay/sctp_probes.go, which under --sctp=false leaves an SCTP probe out and logs that it did.
package npapi

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"text/template"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	k8sclient "k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/flags"
	"sigs.k8s.io/network-policy-api/conformance/utils/kubernetes"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

var sctp = flag.Bool("sctp", true, "whether the cluster's pods can serve SCTP; false leaves the base pods' SCTP servers out")

// suite.Setup's defaults: the first host-network port and how many the base manifests use.
const (
	hostNetworkPortRangeStart = 34345
	hostNetworkPortsAmount    = 8
)

func TestConformance(t *testing.T) {
	cfg, err := config.GetConfig()
	if err != nil {
		t.Fatalf("Error loading Kubernetes config: %v", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("Error initializing Kubernetes client: %v", err)
	}
	// Upstream builds this one from $KUBECONFIG alone; from cfg, --kubeconfig names both clients.
	clientset, err := k8sclient.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("error when creating Kubernetes ClientSet: %v", err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatalf("Error installing api scheme: %v", err)
	}

	t.Logf("Running conformance tests with cleanup: %t, debug: %t, all features: %t, supported features: [%v], exempt features: [%v], sctp: %t",
		*flags.CleanupBaseResources, *flags.ShowDebug, *flags.EnableAllSupportedFeatures, *flags.SupportedFeatures, *flags.ExemptFeatures, *sctp)

	cSuite := suite.New(suite.Options{
		Client:                     c,
		ClientSet:                  clientset,
		KubeConfig:                 *cfg,
		Debug:                      *flags.ShowDebug,
		CleanupBaseResources:       *flags.CleanupBaseResources,
		SupportedFeatures:          suite.ParseSupportedFeatures(*flags.SupportedFeatures),
		ExemptFeatures:             suite.ParseSupportedFeatures(*flags.ExemptFeatures),
		EnableAllSupportedFeatures: *flags.EnableAllSupportedFeatures,
	})
	if *sctp {
		cSuite.Setup(t)
	} else {
		setupWithoutSCTPServers(t, cSuite)
	}
	cSuite.Run(t, tests.ConformanceTests)
}

// setupWithoutSCTPServers is suite.Setup with the default host-network ports, the base
// StatefulSets' SCTP servers left out.
func setupWithoutSCTPServers(t *testing.T, s *suite.ConformanceTestSuite) {
	s.Applier.FS = s.FS
	ports := make([]int, 0, hostNetworkPortsAmount)
	for p := hostNetworkPortRangeStart; p < hostNetworkPortRangeStart+hostNetworkPortsAmount; p++ {
		ports = append(ports, p)
	}
	s.HostNetworkPorts = ports
	s.Applier.HostNetworkPorts = ports
	if !s.SupportedFeatures.Has(suite.SupportClusterNetworkPolicy) {
		return
	}

	t.Logf("Test Setup: Applying base manifests %s without their SCTP servers", s.BaseManifests)
	raw, err := s.FS.ReadFile(s.BaseManifests)
	require.NoErrorf(t, err, "reading %s", s.BaseManifests)
	tmpl, err := template.New(s.BaseManifests).Parse(string(raw))
	require.NoErrorf(t, err, "parsing %s", s.BaseManifests)
	var manifests bytes.Buffer
	require.NoError(t, tmpl.Execute(&manifests, kubernetes.TemplateData{HostNetworkPorts: ports}))

	var namespaces, statefulSets []string
	decoder := yaml.NewYAMLOrJSONDecoder(&manifests, 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := decoder.Decode(obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoErrorf(t, err, "decoding %s", s.BaseManifests)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if obj.GetKind() == "StatefulSet" {
			dropSCTPServers(t, obj)
			namespaces = append(namespaces, obj.GetNamespace())
			statefulSets = append(statefulSets, obj.GetName())
		}
		createOrUpdate(t, s, obj)
	}

	t.Logf("Test Setup: Ensuring Namespaces and Pods from base manifests are ready")
	kubernetes.NamespacesMustBeReady(t, s.Client, s.TimeoutConfig, namespaces, statefulSets)
}

// dropSCTPServers removes the containers that serve SCTP from a StatefulSet's pod template.
func dropSCTPServers(t *testing.T, sts *unstructured.Unstructured) {
	containers, _, err := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "containers")
	require.NoErrorf(t, err, "containers of StatefulSet %s/%s", sts.GetNamespace(), sts.GetName())
	kept := containers[:0]
	for _, c := range containers {
		env, _, _ := unstructured.NestedSlice(c.(map[string]any), "env")
		servesSCTP := false
		for _, e := range env {
			if name, _ := e.(map[string]any)["name"].(string); strings.HasPrefix(name, "SERVE_SCTP_PORT_") {
				servesSCTP = true
			}
		}
		if servesSCTP {
			t.Logf("Test Setup: leaving out container %s of StatefulSet %s/%s (an SCTP server)", c.(map[string]any)["name"], sts.GetNamespace(), sts.GetName())
			continue
		}
		kept = append(kept, c)
	}
	require.NoError(t, unstructured.SetNestedSlice(sts.Object, kept, "spec", "template", "spec", "containers"))
}

// createOrUpdate does for one object what the suite's Applier.MustApplyWithCleanup does.
func createOrUpdate(t *testing.T, s *suite.ConformanceTestSuite, obj *unstructured.Unstructured) {
	ctx, cancel := context.WithTimeout(context.Background(), s.TimeoutConfig.CreateTimeout)
	defer cancel()
	existing := obj.DeepCopy()
	err := s.Client.Get(ctx, types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}, existing)
	switch {
	case apierrors.IsNotFound(err):
		t.Logf("Creating %s %s", obj.GetName(), obj.GetKind())
		require.NoErrorf(t, s.Client.Create(ctx, obj), "error creating resource")
	case err != nil:
		require.NoErrorf(t, err, "error getting resource")
	default:
		obj.SetResourceVersion(existing.GetResourceVersion())
		t.Logf("Updating %s %s", obj.GetName(), obj.GetKind())
		require.NoErrorf(t, s.Client.Update(ctx, obj), "error updating resource")
	}
	if s.Cleanup {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.TimeoutConfig.DeleteTimeout)
			defer cancel()
			t.Logf("Deleting %s %s", obj.GetName(), obj.GetKind())
			if err := s.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
				require.NoErrorf(t, err, "error deleting resource")
			}
		})
	}
}
