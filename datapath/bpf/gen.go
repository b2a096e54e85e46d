// Package bpf holds ONC's eBPF programs (C, one object per feature:
// fastpath.c, services.c, bypass.c; shared headers in include/) and the Go
// bindings bpf2go generates for them, with what loads them and reads their
// counters. The generated files and objects are committed so `go build`
// needs no clang; `make generate` rebuilds them.
package bpf

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -go-package bpf Fastpath fastpath.c
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -go-package bpf Services services.c
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -go-package bpf Bypass bypass.c
