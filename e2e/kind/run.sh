#!/usr/bin/env bash
# The kind bed: a kind cluster (1 control plane + 1 worker; NODES, ZONES) with ONC as its
# only CNI and the fast path on, then the [sig-network] Conformance tests.
# During the run the agent DaemonSet and the controller Deployment are
# restarted (rolling); pods must keep their connectivity, and an agent's
# token must not patch another node's ONCNode. Results (JUnit, e2e log, onctl stats and services
# from every node, cluster state) land in $OUT.
#
#   run.sh [all|up|test|probe|summary|down]   (make e2e-kind runs "all")
#
# Offline (default; this machine has no registry): Docker runs in its own
# network namespace (dockerd.sh) and every image is built locally
# (images.sh). ONC_KIND_ONLINE=1 uses the host's Docker, kind's stock node
# image and registry pulls instead.
#
# KUBE_PROXY=none creates the cluster without kube-proxy and installs ONC
# with its kube-proxy replacement on, dialling the API server on the
# control plane node (docs/install.md, "Without kube-proxy"); iptables (the
# default), nftables or ipvs run kube-proxy in that mode beside ONC.
# LB_MODE=dsr (with KUBE_PROXY=none) sets load-balancer-mode: direct server
# return for clients outside (docs/services.md); snat is the default.
# IP_FAMILY=dual makes a dual-stack cluster (IPv4 first: pods
# 10.244.0.0/16 and fd00:10:244::/56, Services 10.96.0.0/16 and
# fd00:10:96::/112) and installs ONC with both pod ranges; ipv6 an
# IPv6-only one (pods fd00:10:244::/56, Services fd00:10:96::/112, the
# nodes' IPv6 addresses the overlay's tunnel endpoints); ipv4 (the
# default) an IPv4 one.
#
# CNP=1 runs the upstream ClusterNetworkPolicy conformance suite
# (sigs.k8s.io/network-policy-api, through e2e/kind/npa; make builds it as
# NPA_TEST) instead of e2e.test, and saves its ConformanceReport
# (conformance-report.yaml) and log (cnp-conformance.log) in $OUT. The
# restarts and probes run as with e2e.test: the suite's policies select
# only its own pods (by namespace or its conformance-house label), not the
# probes'. FOCUS and SKIP do not apply.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
CLUSTER=${CLUSTER:-onc}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
KUBE_BIN=${KUBE_BIN:?set by make}
KUBE_VERSION=${KUBE_VERSION:?set by make}
CACHE=${CACHE:-/var/cache/onc/kind}
OUT=${OUT:-$root/e2e-kind-results/$(date -u +%Y%m%dT%H%M%SZ)}
FOCUS=${FOCUS:-'\[sig-network\].*\[Conformance\]'}
SKIP=${SKIP:-} # a ginkgo skip regex beside FOCUS, e.g. SCTPConnectivity
CNP=${CNP:-0}
NPA_TEST=${NPA_TEST:-}
# Specs run at once: 1 runs e2e.test itself, more run it under the ginkgo
# CLI in that many processes (for the long [sig-network] runs; Serial specs
# still run alone, last).
PROCS=${PROCS:-1}
RESTART_AFTER=${RESTART_AFTER:-120} # seconds into the test run (of about 6 min)
KUBE_PROXY=${KUBE_PROXY:-iptables}
LB_MODE=${LB_MODE:-snat}
IP_FAMILY=${IP_FAMILY:-ipv4}
# The bed's own servers (nc -l) listen in the pods' primary family.
NC_FAMILY=
case "$IP_FAMILY" in
ipv4) CLUSTER_CIDR=10.244.0.0/16 ;;
dual) CLUSTER_CIDR=10.244.0.0/16,fd00:10:244::/56 ;;
ipv6) CLUSTER_CIDR=fd00:10:244::/56 NC_FAMILY=-6 ;;
*) echo "IP_FAMILY=$IP_FAMILY: ipv4, dual or ipv6" >&2; exit 1 ;;
esac
# Nodes in the cluster, the first the control plane, and the zones the
# workers are spread over in turn (topology.kubernetes.io/zone zone-0,
# zone-1, ...). Without zones (0) every node takes pods; with zones the
# control plane takes none, as the EndpointSlice controller leaves it out
# of its zones' capacity. The topology hints and traffic distribution specs
# want 3 zones of 2 nodes: NODES=7 ZONES=3.
NODES=${NODES:-2}
ZONES=${ZONES:-0}
ONLINE=${ONC_KIND_ONLINE:-0}
export PATH="$KUBE_BIN:$CACHE/bin:$PATH"
export KUBECONFIG=$CACHE/$CLUSTER.kubeconfig
if [ "$ONLINE" = 1 ]; then
  NS=()
  NODE_IMAGE=
else
  NS=(ip netns exec onc-kind)
  export DOCKER_HOST=unix:///run/onc-kind/docker.sock DOCKER_BUILDKIT=0
  NODE_IMAGE=onc-kind/node:$KUBE_VERSION
fi
in_ns() { "${NS[@]}" "$@"; }
kc() { in_ns kubectl "$@"; }
log() { echo "== $(date -u +%H:%M:%S) $*"; }

# cluster_config is cluster.yaml with the kube-proxy mode, the IP
# families and the nodes asked for.
cluster_config() {
  local i family=()
  case "$IP_FAMILY" in
  dual) family=(-e "s|^  podSubnet: .*|  podSubnet: $CLUSTER_CIDR|" -e 's|^  disableDefaultCNI: true$|&\n  ipFamily: dual\n  serviceSubnet: 10.96.0.0/16,fd00:10:96::/112|') ;;
  ipv6) family=(-e "s|^  podSubnet: .*|  podSubnet: $CLUSTER_CIDR|" -e 's|^  disableDefaultCNI: true$|&\n  ipFamily: ipv6\n  serviceSubnet: fd00:10:96::/112|') ;;
  esac
  sed -e "s/^  kubeProxyMode: iptables$/  kubeProxyMode: $KUBE_PROXY/" -e '/^  - role: /d' "${family[@]}" "$here/cluster.yaml" |
    while IFS= read -r line; do
      printf '%s\n' "$line"
      [ "$line" = "nodes:" ] || continue
      echo "  - role: control-plane"
      for ((i = 0; i < NODES - 1; i++)); do
        echo "  - role: worker"
        if [ "$ZONES" -gt 0 ]; then
          echo "    labels:"
          echo "      topology.kubernetes.io/zone: zone-$((i % ZONES))"
        fi
      done
    done
}

up() {
  mkdir -p "$CACHE/bin"
  [ -x "$CACHE/bin/kind" ] || GOBIN=$CACHE/bin go install "sigs.k8s.io/kind@$KIND_VERSION"
  if [ "$ONLINE" != 1 ]; then
    "$here/prereqs.sh"
    "$here/dockerd.sh" start
    CACHE=$CACHE KUBE_BIN=$KUBE_BIN KUBE_VERSION=$KUBE_VERSION KIND_VERSION=$KIND_VERSION NODE_IMAGE=$NODE_IMAGE "$here/images.sh"
    make -C "$root" image IMAGE_BASE=onc-kind/base:bookworm DOCKER="ip netns exec onc-kind docker"
  else
    make -C "$root" image
  fi
  # The tree the image was built from, which summary.md names: the tree
  # may move on while the tests run.
  git -C "$root" describe --always --dirty > "$CACHE/$CLUSTER.image-commit"
  if ! in_ns kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "creating kind cluster $CLUSTER, kube-proxy mode $KUBE_PROXY"
    cluster_config > "$CACHE/$CLUSTER.cluster.yaml"
    [ "$IP_FAMILY" = ipv4 ] || grep -q "^  ipFamily: $IP_FAMILY\$" "$CACHE/$CLUSTER.cluster.yaml" ||
      { echo "cluster.yaml took no ipFamily: $IP_FAMILY; see cluster_config" >&2; exit 1; }
    in_ns kind create cluster --name "$CLUSTER" --config "$CACHE/$CLUSTER.cluster.yaml" ${NODE_IMAGE:+--image "$NODE_IMAGE"} \
      --kubeconfig "$KUBECONFIG"
  fi
  in_ns kind export kubeconfig --name "$CLUSTER" --kubeconfig "$KUBECONFIG"
  # A cluster left up is reused: it must have kube-proxy or not as asked,
  # as many nodes and zones, the same IP families.
  local want=yes have=yes count zones families
  [ "$KUBE_PROXY" != none ] || want=no
  kc -n kube-system get daemonset kube-proxy >/dev/null 2>&1 || have=no
  count=$(in_ns kind get nodes --name "$CLUSTER" | wc -l)
  zones=$(kc get nodes -o jsonpath='{range .items[*]}{.metadata.labels.topology\.kubernetes\.io/zone}{"\n"}{end}' | sort -u | grep -c . || true)
  families=$(kc get nodes -o jsonpath='{.items[0].status.addresses[*].address}')
  case " $families " in
  *" "*.*.*.*" "*:*|*:*" "*.*.*.*" "*) families=dual ;;
  *:*) families=ipv6 ;;
  *) families=ipv4 ;;
  esac
  if [ "$want" != "$have" ] || [ "$count" != "$NODES" ] || [ "$zones" != "$ZONES" ] || [ "$families" != "$IP_FAMILY" ]; then
    echo "cluster $CLUSTER (kube-proxy: $have, $count nodes, $zones zones, $families) was made for another KUBE_PROXY, NODES, ZONES or IP_FAMILY than $KUBE_PROXY, $NODES, $ZONES, $IP_FAMILY: make e2e-kind-down first" >&2
    exit 1
  fi
  if [ "$ZONES" -gt 0 ]; then
    kc taint node "$(control_plane)" node-role.kubernetes.io/control-plane:NoSchedule --overwrite
  fi
  # A machine's systemd mounts a bpffs at /sys/fs/bpf; a kind node's (a
  # container) does not, and the agent needs one (docs/install.md).
  local node
  for node in $(in_ns kind get nodes --name "$CLUSTER"); do
    in_ns docker exec "$node" sh -c 'mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf'
  done
  log "loading the ONC image and applying manifests/onc.yaml"
  in_ns kind load docker-image onc:dev --name "$CLUSTER"
  # The pod ranges before the controller's first start: a Node keeps the
  # pod CIDRs it first gets.
  sed "s|^  cluster-cidr: \"10.244.0.0/16\"$|  cluster-cidr: \"$CLUSTER_CIDR\"|" "$root/manifests/onc.yaml" | kc apply -f -
  kc -n onc-system get configmap onc-config -o jsonpath='{.data.cluster-cidr}' | grep -qx "$CLUSTER_CIDR" ||
    { echo "onc-config's cluster-cidr is not $CLUSTER_CIDR" >&2; exit 1; }
  if [ "$KUBE_PROXY" = none ]; then
    # The edit docs/install.md asks for; the restart below brings it in.
    local apiserver
    # A dual-stack node lists an InternalIP per family: the first is the
    # cluster's first family's, the one its API server advertises.
    apiserver=$(kc get node "$(control_plane)" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}' | awk '{print $1}')
    log "kube-proxy replacement on ($LB_MODE), API server at $apiserver:6443"
    kc -n onc-system patch configmap onc-config --type merge \
      -p '{"data":{"kube-proxy-replacement":"true","load-balancer-mode":"'"$LB_MODE"'","k8s-service-host":"'"$apiserver"'","k8s-service-port":"6443"}}'
  elif [ "$LB_MODE" != snat ]; then
    echo "LB_MODE=$LB_MODE needs KUBE_PROXY=none: beside kube-proxy, kube-proxy serves clients outside" >&2
    exit 1
  fi
  # Same tag, maybe a new image: restart so the pods run what was loaded.
  kc -n onc-system rollout restart ds/onc-agent deploy/onc-controller
  kc -n onc-system rollout status ds/onc-agent --timeout=5m
  kc -n onc-system rollout status deploy/onc-controller --timeout=5m
  kc wait --for=condition=Ready nodes --all --timeout=5m
  kc -n kube-system rollout status deploy/coredns --timeout=5m
  kc get nodes -o wide
  kc get oncnodes -o wide
}

# Helpers for the bed's own probes: pods of agnhost's image pinned to a node.
AGNHOST=registry.k8s.io/e2e-test-images/agnhost:2.59
control_plane() { kc get nodes -l node-role.kubernetes.io/control-plane -o jsonpath='{.items[0].metadata.name}'; }
worker() { kc get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{.items[0].metadata.name}'; }
agent_pod() { # node
  kc -n onc-system get pods -l app.kubernetes.io/name=onc-agent --field-selector spec.nodeName="$1" -o jsonpath='{.items[0].metadata.name}'
}
run_on() { # namespace pod node script
  kc -n "$1" run "$2" --image=$AGNHOST --restart=Never --overrides='{"spec":{"nodeName":"'"$3"'"}}' --command -- sh -c "$4" >&2
}
# serve makes a fresh namespace with a pod "sink" on the node running the
# script, and prints the pod's IP once it is ready (kubectl's chatter to stderr).
serve() { # namespace node script
  # Chained: errexit does not reach into the caller's $(...).
  kc delete namespace "$1" --ignore-not-found --wait=true >&2 && kc create namespace "$1" >&2 &&
    run_on "$1" sink "$2" "$3" && kc -n "$1" wait --for=condition=Ready pod/sink --timeout=2m >&2 &&
    kc -n "$1" get pod sink -o jsonpath='{.status.podIP}'
}

# rolling_restart restarts the whole agent DaemonSet, then the controller
# Deployment, as an upgrade does, while traffic crosses both ways between
# the nodes, and fails unless the traffic never noticed: from a pod on each
# node to a pod on the other, one TCP connection carrying a line every
# 0.1 s and a ping every 0.2 s, for two minutes that start before the first
# restart and end after both rollouts are done.
rolling_restart() {
  sleep "$RESTART_AFTER"
  local cp wk ok=1 from to ns ip
  cp=$(control_plane)
  wk=$(worker)
  exec > "$OUT/rolling-restart.txt" 2>&1
  for ns in onc-restart-to-cp onc-restart-to-wk; do
    if [ "$ns" = onc-restart-to-cp ]; then from=$wk to=$cp; else from=$cp to=$wk; fi
    ip=$(serve "$ns" "$to" "nc $NC_FAMILY -l 8080 | wc -l; sleep infinity")
    echo "traffic from $from to pod $ip on $to (namespace $ns)"
    run_on "$ns" src "$from" "ping -q -i 0.2 -c 600 $ip > /tmp/ping & i=0
      while [ \$i -lt 1200 ]; do i=\$((i+1)); echo \$i; sleep 0.1; done | nc -N $ip 8080; rc=\$?
      wait; cat /tmp/ping; exit \$rc"
  done
  kc -n onc-restart-to-cp wait --for=condition=Ready pod/src --timeout=2m
  kc -n onc-restart-to-wk wait --for=condition=Ready pod/src --timeout=2m
  local started=$SECONDS
  sleep 10
  echo "$(date -u +%FT%TZ) rollout restart ds/onc-agent"
  kc -n onc-system rollout restart ds/onc-agent
  kc -n onc-system rollout status ds/onc-agent --timeout=5m
  echo "$(date -u +%FT%TZ) rollout restart deploy/onc-controller"
  kc -n onc-system rollout restart deploy/onc-controller
  kc -n onc-system rollout status deploy/onc-controller --timeout=5m
  echo "$(date -u +%FT%TZ) both rollouts done, $((SECONDS - started)) s after the traffic started:"
  kc -n onc-system get pods -o wide
  # The traffic lasts 120 s: the rollouts must end inside it to count.
  [ $((SECONDS - started)) -lt 110 ] || { echo "FAIL: the rollouts outlasted the traffic"; ok=0; }
  for ns in onc-restart-to-cp onc-restart-to-wk; do
    kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Succeeded pod/src --timeout=3m || ok=0
    local srclog got
    srclog=$(kc -n "$ns" logs src)
    got=$(kc -n "$ns" logs sink)
    echo "$(date -u +%FT%TZ) $ns: ping: $srclog"
    echo "$ns: lines the server received on the one TCP connection: $got of 1200"
    [ "$got" = 1200 ] || ok=0
    grep -q ' 0% packet loss' <<<"$srclog" || ok=0
    kc delete namespace "$ns" --wait=false
  done
  if [ "$ok" = 1 ]; then echo "PASS: no packet lost, both connections carried on"; else echo "FAIL: traffic broke across the rolling restarts"; return 1; fi
}

# admission_probe checks, with a token as the worker's agent holds it (its
# service account's, bound to its pod, so it carries the node claim), that
# patching the control plane's ONCNode is refused and its own is not.
admission_probe() {
  local cp wk pod tok server out fp ok=1
  cp=$(control_plane)
  wk=$(worker)
  pod=$(agent_pod "$wk")
  tok=$(kc -n onc-system create token onc-agent --bound-object-kind=Pod --bound-object-name="$pod" --duration=10m)
  server=$(kc config view --minify -o jsonpath='{.clusters[0].cluster.server}')
  # A merge patch as the agent sends it (kubectl patch would GET first,
  # which the agent's role does not allow: it only lists and watches).
  # Prints the HTTP status and the API's message.
  patch_as_agent() { # node json
    local body code
    body=$(mktemp)
    code=$(in_ns curl -sS -k -o "$body" -w '%{http_code}' -X PATCH -H "Authorization: Bearer $tok" \
      -H 'Content-Type: application/merge-patch+json' "$server/apis/onc.io/v1alpha1/oncnodes/$1" -d "$2")
    echo "$code $(jq -r '.message // "ok"' "$body")"
    rm -f "$body"
  }
  {
    echo "# as system:serviceaccount:onc-system:onc-agent, token bound to pod $pod on $wk"
    out=$(patch_as_agent "$cp" '{"spec":{"nodeIP":"192.0.2.66"}}')
    echo "patching $cp's ONCNode: HTTP $out"
    [[ "$out" == "403 "*"may write only ONCNode $wk, not $cp" ]] || { echo "FAIL: not refused"; ok=0; }
    fp=$(kc get oncnode "$wk" -o jsonpath='{.spec.fastPath}')
    out=$(patch_as_agent "$wk" "{\"spec\":{\"fastPath\":$fp}}")
    echo "patching its own ONCNode ($wk), fastPath to its value, $fp: HTTP $out"
    [[ "$out" == "200 "* ]] || { echo "FAIL: refused"; ok=0; }
    if [ "$ok" = 1 ]; then echo "PASS"; fi
  } > "$OUT/admission-probe.txt" 2>&1
  cat "$OUT/admission-probe.txt"
  [ "$ok" = 1 ]
}

# cnp_conformance runs the ClusterNetworkPolicy conformance suite as
# e2e.test runs: in the bed's network namespace, on the bed's kubeconfig.
# Profile ClusterNetworkPolicy; of its experimental features only named
# ports are claimed: the node peers tests probe SCTP and are skipped, and a
# feature is claimed only where its tests ran. The runner skips every test
# that probes SCTP (e2e/kind/npa/npa.go says which and why).
cnp_conformance() {
  [ -x "$NPA_TEST" ] || { echo "NPA_TEST=$NPA_TEST: no runner (CNP=1 make e2e-kind builds it)" >&2; return 1; }
  # The manifest carries the CRDs; the suite refuses a cluster without them.
  kc wait --for=condition=Established crd/clusternetworkpolicies.policy.networking.k8s.io --timeout=1m || return 1
  # Its host-network StatefulSet (2 replicas on the same ports) wants two nodes.
  local schedulable
  schedulable=$(kc get nodes -o jsonpath='{range .items[*]}{.spec.taints[*].effect}{"\n"}{end}' | grep -vc NoSchedule || true)
  [ "$schedulable" -ge 2 ] || { echo "the suite needs 2 schedulable nodes; the cluster has $schedulable" >&2; return 1; }
  in_ns "$NPA_TEST" -test.v -test.timeout=90m -test.run '^TestClusterNetworkPolicyConformance$' \
    --kubeconfig="$KUBECONFIG" --conformance-profiles=ClusterNetworkPolicy \
    --supported-features=ClusterNetworkPolicyNamedPorts \
    --organization=onc-net --project=onc --url=https://github.com/onc-net/onc \
    --version="$(cat "$CACHE/$CLUSTER.image-commit")" --contact=https://github.com/onc-net/onc/issues \
    --additional-info="kind bed (e2e/kind/run.sh, CNP=1), Kubernetes $KUBE_VERSION, kube-proxy $KUBE_PROXY, $IP_FAMILY; upstream tests through e2e/kind/npa: no SCTP in the kernel, so the base pods lack their SCTP servers and the tests probing SCTP are skipped" \
    --report-output="$OUT/conformance-report.yaml" > "$OUT/cnp-conformance.log" 2>&1
}

test_() {
  mkdir -p "$OUT"
  if [ "$CNP" = 1 ]; then
    log "running the ClusterNetworkPolicy conformance suite (results in $OUT)"
  else
    log "running e2e.test --ginkgo.focus=$FOCUS --ginkgo.skip=$SKIP (results in $OUT)"
  fi
  rolling_restart &
  local restarts=$!
  local rc=0
  # --num-nodes: the skeleton provider knows no node count, and specs that
  # need two nodes (the Granular Checks, externalTrafficPolicy) skip
  # themselves without it.
  local nodes
  nodes=$(kc get nodes --no-headers | wc -l)
  if [ "$CNP" = 1 ]; then
    cnp_conformance || rc=$?
  elif [ "$PROCS" -gt 1 ]; then
    in_ns ginkgo --procs="$PROCS" --focus="$FOCUS" ${SKIP:+--skip="$SKIP"} --no-color --timeout=3h "$KUBE_BIN/e2e.test" -- \
      --kubeconfig="$KUBECONFIG" --provider=skeleton --num-nodes="$nodes" --report-dir="$OUT" > "$OUT/e2e.log" 2>&1 || rc=$?
  else
    in_ns e2e.test --kubeconfig="$KUBECONFIG" --provider=skeleton --num-nodes="$nodes" --ginkgo.focus="$FOCUS" ${SKIP:+--ginkgo.skip="$SKIP"} \
      --ginkgo.no-color --ginkgo.timeout=2h --report-dir="$OUT" > "$OUT/e2e.log" 2>&1 || rc=$?
  fi
  # The restart check ends about five minutes in, before the run does.
  wait "$restarts" || rc=1
  admission_probe || rc=1
  fastpath_probe || true
  service_probe || true
  trace_probe || rc=1
  overlay_probe || rc=1
  collect
  summarize
  return $rc
}

# summarize writes summary.md: versions, the result of every spec that ran,
# the agent restart and the probes.
summarize() {
  local junit=$OUT/junit_01.xml
  {
    echo "# e2e on kind with ONC — $(date -u +%F)"
    echo
    if [ "$CNP" = 1 ]; then
      echo "ClusterNetworkPolicy conformance (upstream suite, profile ClusterNetworkPolicy, e2e/kind/npa)."
    else
      echo "Focus \`$FOCUS\`, skip \`${SKIP:-none}\`."
    fi
    echo
    echo "Kubernetes $KUBE_VERSION (built from source), kind $KIND_VERSION, ONC $(cat "$CACHE/$CLUSTER.image-commit" 2>/dev/null || echo unknown) (the image's tree),"
    echo "kube-proxy: $KUBE_PROXY$([ "$KUBE_PROXY" != none ] || echo " (ONC replaces it, load-balancer-mode $LB_MODE)"), IP family $IP_FAMILY,"
    echo "$NODES nodes$([ "$ZONES" = 0 ] || echo " in $ZONES zones"),"
    echo "containerd $(kc get nodes -o jsonpath='{.items[0].status.nodeInfo.containerRuntimeVersion}'), kernel $(uname -r)."
    echo
    if [ "$CNP" = 1 ]; then
      cnp_summary
    else
      echo '```'
      grep -E '^(Ran [0-9]+ of|SUCCESS!|FAIL!)' "$OUT/e2e.log" || true
      echo '```'
      echo
      echo "| result | spec |"
      echo "| --- | --- |"
      grep -o '<testcase name="[^"]*" classname="[^"]*" status="\(passed\|failed\|timedout\|panicked\)"' "$junit" 2>/dev/null |
        sed -E 's/<testcase name="([^"]*)" classname="[^"]*" status="([a-z]*)"/| \2 | \1 |/' | sed 's/&#39;/'"'"'/g; s/&#34;/"/g; s/&amp;/\&/g' | sort
    fi
    echo
    echo "## Rolling restarts of the agent DaemonSet and the controller Deployment mid-run"
    echo '```'
    cat "$OUT/rolling-restart.txt" 2>/dev/null
    echo '```'
    echo
    echo "## An agent's token patching ONCNodes"
    echo '```'
    cat "$OUT/admission-probe.txt" 2>/dev/null
    echo '```'
    echo
    echo "## Fast path: hit counters around a 200 MB transfer across nodes"
    echo '```'
    cat "$OUT/fastpath-probe.txt" 2>/dev/null
    echo '```'
    echo
    echo "## Services at the socket: the same through a ClusterIP"
    echo '```'
    cat "$OUT/service-probe.txt" 2>/dev/null
    echo '```'
    echo
    echo "## The overlay guard: VXLAN frames crafted by a pod"
    echo '```'
    cat "$OUT/overlay-probe.txt" 2>/dev/null
    echo '```'
  } > "$OUT/summary.md"
  echo "summary: $OUT/summary.md"
  if [ "$CNP" = 1 ]; then
    sed -n '/^profiles:/,$p' "$OUT/conformance-report.yaml" 2>/dev/null || tail -5 "$OUT/cnp-conformance.log"
    return
  fi
  # The JUnit report less its thousands of skipped specs, small enough to keep.
  awk '/<testcase .*status="skipped"/ {skip = 1} !skip {print} skip && /<\/testcase>/ {skip = 0}' "$junit" > "$OUT/junit-ran.xml"
  grep -E '^(Ran [0-9]+ of|SUCCESS!|FAIL!)' "$OUT/e2e.log" || tail -5 "$OUT/e2e.log"
}

# cnp_summary prints the ConformanceReport's results and each test's: the
# report counts a test skipped through SkipTests as skipped, where go test
# says PASS (it returned early), so those take the runner's word.
cnp_summary() {
  echo '```yaml'
  sed -n '/^profiles:/,$p' "$OUT/conformance-report.yaml" 2>/dev/null || echo "no report: see cnp-conformance.log"
  echo '```'
  echo
  echo "| result | test |"
  echo "| --- | --- |"
  awk '/: skipping [A-Za-z]+ \(no SCTP/ { for (i = 1; i < NF; i++) if ($i == "skipping") sctp[$(i + 1)] = 1 }
    /^    --- (PASS|FAIL|SKIP): TestClusterNetworkPolicyConformance\/[A-Za-z]+ / {
      split($3, a, "/"); r = tolower($2); sub(":", "", r)
      if (r == "skip") r = "not run (feature not claimed)"; else if (a[2] in sctp) r = "skipped (SCTP)"
      print "| " r " | " a[2] " |"
    }' "$OUT/cnp-conformance.log" 2>/dev/null | sort
}

# hits prints the fast path's egress and ingress hit counters of the agent
# on node $1, and its egress misses for want of a fast-path peer (what a
# packet to a ClusterIP would count); IPv6 packets' as egress6_hit etc.
hits() {
  kc -n onc-system exec "$(agent_pod "$1")" -c onc-agent -- onctl stats -o json |
    jq -r '[.counters[] | select(.name == "hit" or .name == "miss_no_peer") |
      "\(.program)\(if .family == "ipv6" then "6" else "" end)_\(.name)=\(.value)"] | join(" ")'
}

# fastpath_probe sends 200 MB over TCP from a pod on the worker to a pod on
# the control plane and records the worker's and control plane's hit
# counters before and after: the fast path carried it if they grew.
fastpath_probe() {
  local cp wk ip
  cp=$(control_plane)
  wk=$(worker)
  ip=$(serve onc-probe "$cp" "while true; do nc $NC_FAMILY -l 8080 > /dev/null; done" 2>/dev/null)
  {
    echo "# 200 MB TCP, pod on $wk -> pod $ip on $cp"
    echo "before: $wk $(hits "$wk") | $cp $(hits "$cp")"
    run_on onc-probe src "$wk" "head -c 200000000 /dev/zero | nc -N $ip 8080" 2>/dev/null
    kc -n onc-probe wait --for=jsonpath='{.status.phase}'=Succeeded pod/src --timeout=5m >/dev/null
    echo "after:  $wk $(hits "$wk") | $cp $(hits "$cp")"
  } > "$OUT/fastpath-probe.txt" 2>&1
  kc delete namespace onc-probe --wait=false >/dev/null
  cat "$OUT/fastpath-probe.txt"
}

# trace_probe traces a connection from a pod on the worker to a pod on the
# control plane with onctl trace --probe on the worker: the control plane's
# agent answers for its pod over the peer API (docs/observability.md), so
# the ingress hop is that node's, basis enforced, and the probe agrees.
trace_probe() {
  local cp wk ip out
  cp=$(control_plane)
  wk=$(worker)
  ip=$(serve onc-traceprobe "$cp" "while true; do nc $NC_FAMILY -l 8080 > /dev/null; done" 2>/dev/null)
  run_on onc-traceprobe src "$wk" "sleep 300" 2>/dev/null
  kc -n onc-traceprobe wait --for=condition=Ready pod/src --timeout=2m >/dev/null
  {
    echo "# onctl trace --probe onc-traceprobe/src (on $wk) onc-traceprobe/sink:8080 ($ip on $cp)"
    kc -n onc-system exec "$(agent_pod "$wk")" -c onc-agent -- onctl trace --probe onc-traceprobe/src onc-traceprobe/sink:8080
    kc -n onc-system exec "$(agent_pod "$wk")" -c onc-agent -- onctl trace --probe -o json onc-traceprobe/src onc-traceprobe/sink:8080
  } > "$OUT/trace-probe.txt" 2>&1
  kc delete namespace onc-traceprobe --wait=false >/dev/null
  out=$(cat "$OUT/trace-probe.txt")
  echo "$out" | head -12
  # The destination's own answer, and agreement.
  grep -q '"basis": *"enforced"' <<<"$out" && grep -q "$cp  *ingress-policy" <<<"$out" && grep -q AGREES <<<"$out"
}

# service_probe is fastpath_probe through a ClusterIP: the socket LB sends
# the connection to the pod's IP from its first packet, so the fast path
# carries it and the worker's egress miss_no_peer stays still.
service_probe() {
  local cp wk ip vip
  cp=$(control_plane)
  wk=$(worker)
  ip=$(serve onc-svcprobe "$cp" "while true; do nc $NC_FAMILY -l 8080 > /dev/null; done" 2>/dev/null)
  kc -n onc-svcprobe expose pod sink --port 80 --target-port 8080 >/dev/null
  vip=$(kc -n onc-svcprobe get service sink -o jsonpath='{.spec.clusterIP}')
  sleep 2 # the agents' informers
  {
    echo "# 200 MB TCP, pod on $wk -> Service $vip:80 -> pod $ip:8080 on $cp"
    echo "before: $wk $(hits "$wk") | $cp $(hits "$cp")"
    run_on onc-svcprobe src "$wk" "head -c 200000000 /dev/zero | nc -N $vip 80" 2>/dev/null
    kc -n onc-svcprobe wait --for=jsonpath='{.status.phase}'=Succeeded pod/src --timeout=5m >/dev/null
    echo "after:  $wk $(hits "$wk") | $cp $(hits "$cp")"
    echo "onctl services on $wk:"
    kc -n onc-system exec "$(agent_pod "$wk")" -c onc-agent -- onctl services | grep -E "^FRONTEND|onc-svcprobe|^Socket LB|^Kube-proxy|^Counters"
  } > "$OUT/service-probe.txt" 2>&1
  kc delete namespace onc-svcprobe --wait=false >/dev/null
  cat "$OUT/service-probe.txt"
}

# checksum prints the Internet checksum of the hex digits $1 (whole bytes),
# as 4 hex digits.
checksum() {
  local hex=$1 sum=0 i
  ((${#hex} % 4 == 0)) || hex+=00
  for ((i = 0; i < ${#hex}; i += 4)); do sum=$((sum + 16#${hex:i:4})); done
  while ((sum > 0xffff)); do sum=$(((sum & 0xffff) + (sum >> 16))); done
  printf '%04x' $((~sum & 0xffff))
}

# ip6hex prints IPv6 address $1 as its 32 hex digits.
ip6hex() {
  local a=$1 head tail g i n out=
  local -a h=() t=()
  if [[ $a == *::* ]]; then head=${a%%::*} tail=${a#*::}; else head=$a tail=; fi
  [ -z "$head" ] || IFS=: read -ra h <<<"$head"
  [ -z "$tail" ] || IFS=: read -ra t <<<"$tail"
  n=$((8 - ${#h[@]} - ${#t[@]}))
  for g in "${h[@]}"; do out+=$(printf '%04x' $((16#$g))); done
  for ((i = 0; i < n; i++)); do out+=0000; done
  for g in "${t[@]}"; do out+=$(printf '%04x' $((16#$g))); done
  echo "$out"
}

# vxlan_frame prints, as printf's octal escapes, the payload of a VXLAN datagram
# as a peer's kernel builds it (VNI 1): an Ethernet frame to the VTEP MAC
# $1 carrying a UDP datagram from $2 to $3:7999 whose payload is $4, in
# IPv4 or IPv6 (the addresses').
vxlan_frame() { # vtep-mac inner-src inner-dst payload
  local mac=$1 src=$2 dst=$3 payload=$4 hex ip udp data i
  local udplen=$((8 + ${#payload}))
  hx() { printf '%02x' "$@"; }
  data=$(printf '%s' "$payload" | od -An -tx1 | tr -d ' \n')
  if [[ $src == *:* ]]; then
    src=$(ip6hex "$src") dst=$(ip6hex "$dst")
    ip="60000000$(printf '%04x' "$udplen")1140$src$dst"
    # IPv6 requires the UDP checksum, over the pseudo-header too.
    udp="9c401f3f$(printf '%04x' "$udplen")"
    udp+=$(checksum "$src$dst$(printf '%08x' "$udplen")00000011${udp}0000$data")
    hex="0800000000000100${mac//:/}02beef000001""86dd$ip$udp$data"
  else
    ip="4500$(printf '%04x' $((20 + udplen)))0000000040110000$(hx ${src//./ })$(hx ${dst//./ })"
    ip="${ip:0:20}$(checksum "$ip")${ip:24}"
    hex="0800000000000100${mac//:/}02beef000001""0800$ip""9c401f3f$(printf '%04x' "$udplen")0000$data"
  fi
  # Octal escapes: the pods' sh (dash) has no \x in printf.
  for ((i = 0; i < ${#hex}; i += 2)); do printf '\\%03o' "0x${hex:i:2}"; done
}

# overlay_probe: a pod on the worker crafts VXLAN frames in user space and
# sends them with an ordinary UDP socket to the control plane's VXLAN port,
# the inner packet addressed to a pod there, its source another pod's. The
# worker's agent must drop them (overlay_drop_from_pod) and the pod there
# receive nothing. Then the worker itself, a peer speaking for its own pod,
# sends the same kind of frame: that one arrives, so the frames are good.
# It fails unless all three hold.
overlay_probe() {
  local cp wk ip cpip mac victim f before after got ok=1
  cp=$(control_plane)
  wk=$(worker)
  ip=$(serve onc-overlayprobe "$cp" "nc $NC_FAMILY -u -l 7999 > /tmp/got; sleep infinity" 2>/dev/null)
  cpip=$(kc get oncnode "$cp" -o jsonpath='{.spec.nodeIP}')
  mac=$(kc get oncnode "$cp" -o jsonpath='{.spec.vtepMAC}')
  run_on onc-overlayprobe victim "$wk" 'sleep infinity' 2>/dev/null
  kc -n onc-overlayprobe wait --for=condition=Ready pod/victim --timeout=2m >/dev/null
  victim=$(kc -n onc-overlayprobe get pod victim -o jsonpath='{.status.podIP}')
  {
    echo "# VXLAN frames from a pod on $wk to $cp ($cpip:4789), inner $victim -> pod $ip:7999"
    before=$(drops "$wk")
    echo "before: $wk $before"
    f=$(vxlan_frame "$mac" "$victim" "$ip" "injected-by-a-pod")
    # From a file: one read, one datagram (printf may write in pieces).
    run_on onc-overlayprobe injector "$wk" "printf '$f' > /tmp/frame; for i in 1 2 3 4 5; do nc -u -w1 $cpip 4789 < /tmp/frame; done" 2>/dev/null
    kc -n onc-overlayprobe wait --for=jsonpath='{.status.phase}'=Succeeded pod/injector --timeout=2m >/dev/null
    after=$(drops "$wk")
    echo "after:  $wk $after"
    got=$(kc -n onc-overlayprobe exec sink -- cat /tmp/got)
    echo "the pod on $cp received: [$got]"
    [ -z "$got" ] || { echo "FAIL: the pod's frames were delivered"; ok=0; }
    [ "$(drop_count "$after" from_pod)" -ge $(($(drop_count "$before" from_pod) + 5)) ] ||
      { echo "FAIL: $wk did not count the pod's 5 frames as from_pod"; ok=0; }
    f=$(vxlan_frame "$mac" "$victim" "$ip" "sent-by-the-node")
    # socat takes an IPv6 address in brackets, and an IPv4 one without.
    local to=$cpip
    [[ $cpip == *:* ]] && to="[$cpip]"
    in_ns docker exec "$wk" bash -c "printf '$f' > /tmp/onc-frame; for i in 1 2 3; do socat -u FILE:/tmp/onc-frame UDP:$to:4789; sleep 0.2; done; rm /tmp/onc-frame"
    sleep 1
    got=$(kc -n onc-overlayprobe exec sink -- cat /tmp/got)
    echo "control, the same frame from $wk itself: the pod on $cp received: [$got]"
    [[ $got == *sent-by-the-node* ]] || { echo "FAIL: the node's own frame was not delivered: the probe proves nothing"; ok=0; }
    [ $ok = 1 ] && echo PASS
  } > "$OUT/overlay-probe.txt" 2>&1
  kc delete namespace onc-overlayprobe --wait=false >/dev/null
  cat "$OUT/overlay-probe.txt"
  grep -qx PASS "$OUT/overlay-probe.txt"
}

# drops prints the overlay guard's counters of the agent on node $1.
drops() {
  kc -n onc-system exec "$(agent_pod "$1")" -c onc-agent -- onctl stats -o json |
    jq -r '[.counters[] | select(.program == "overlay") | "\(.name)=\(.value)"] | join(" ")'
}

# drop_count prints counter drop_$2 of a drops line $1 (0 if absent).
drop_count() {
  local v
  v=$(tr ' ' '\n' <<<"$1" | sed -n "s/^drop_$2=//p")
  echo "${v:-0}"
}

# collect saves what proves the run: onctl stats and state from each node.
collect() {
  local pod node
  for pod in $(kc -n onc-system get pods -l app.kubernetes.io/name=onc-agent -o jsonpath='{.items[*].metadata.name}'); do
    node=$(kc -n onc-system get pod "$pod" -o jsonpath='{.spec.nodeName}')
    for what in status stats peers services; do
      kc -n onc-system exec "$pod" -c onc-agent -- onctl "$what" > "$OUT/onctl-$what-$node.txt" 2>&1 || true
    done
    # The packets policy denied during the run, as the node's flow records hold them;
    # and every record the node holds (each family within its share of the buffer).
    kc -n onc-system exec "$pod" -c onc-agent -- onctl flows --verdict denied -o json > "$OUT/onctl-flows-denied-$node.json" 2>&1 || true
    kc -n onc-system exec "$pod" -c onc-agent -- onctl flows -o json > "$OUT/onctl-flows-$node.json" 2>&1 || true
    # kube-proxy's health endpoint, the agent's when it replaces kube-proxy.
    in_ns docker exec "$node" curl -sS -i http://127.0.0.1:10256/healthz > "$OUT/healthz-$node.txt" 2>&1 || true
  done
  {
    echo "# kind bed, $(date -u +%F), Kubernetes $KUBE_VERSION, kind $KIND_VERSION"
    kc version 2>/dev/null || true
    kc get nodes -o wide
    kc get oncnodes -o wide
    kc -n onc-system get pods -o wide
    kc -n onc-system get configmap onc-ipam -o yaml
  } > "$OUT/cluster.txt" 2>&1 || true
  kc -n onc-system logs -l app.kubernetes.io/name=onc-agent --tail=-1 --prefix > "$OUT/onc-agent.log" 2>&1 || true
  kc -n onc-system logs -l app.kubernetes.io/name=onc-controller --tail=-1 --prefix > "$OUT/onc-controller.log" 2>&1 || true
}

down() {
  if [ "$ONLINE" != 1 ] && [ ! -S /run/onc-kind/docker.sock ]; then return 0; fi
  in_ns kind delete cluster --name "$CLUSTER" || true
  [ "$ONLINE" = 1 ] || "$here/dockerd.sh" stop
}

case ${1:-all} in
  all) up; test_ ;;
  up) up ;;
  test) test_ ;;
  probe) mkdir -p "$OUT"; admission_probe; fastpath_probe; service_probe; trace_probe; overlay_probe ;;
  summary) summarize ;;
  down) down ;;
  *) echo "usage: $0 [all|up|test|probe|summary|down]" >&2; exit 2 ;;
esac
