// Package bpf holds ONC's eBPF programs (C, one object per attach point,
// shared headers in include/) and the Go bindings bpf2go generates for
// them. The generated files and objects are committed so `go build` needs
// no clang; `make generate` rebuilds them.
package bpf

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -go-package bpf -type onc_stat EgressFast egress.c
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -go-package bpf IngressFast ingress.c
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -go-package bpf LearnEgress learn_egress.c
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -go-package bpf LearnIngress learn_ingress.c
