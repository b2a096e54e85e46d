// Package services balances Kubernetes Services at the socket: cgroup v2
// programs (datapath/bpf/services.c) rewrite a ClusterIP:port to a backend
// pod in connect() and sendmsg(), and back in recvmsg() and getpeername(),
// so Service traffic is pod-to-pod from its first packet and the flow
// cache carries it. Only sockets of network namespaces this node owns (its
// host's and its pods', by netns cookie) are touched: several agents on
// one kernel share one cgroup root.
package services
