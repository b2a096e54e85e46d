# ONC's image: the CNI plugin (installed on the host by the agent's init
# container), onc-agent, onc-controller and onctl. `make image` builds the
# static binaries first; this only packs them.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
# The agent programs iptables (masquerade, forward, conntrack mark) and
# nftables (NetworkPolicy).
RUN { command -v iptables && command -v nft; } >/dev/null || { apt-get update \
    && apt-get install -y --no-install-recommends iptables nftables && rm -rf /var/lib/apt/lists/*; }
COPY bin/onc bin/onc-agent bin/onc-controller bin/onctl /usr/local/bin/
LABEL org.opencontainers.image.title="ONC" org.opencontainers.image.description="Kubernetes CNI: VXLAN overlay with an eBPF flow cache"
