// Command onc is the CNI plugin: /opt/cni/bin/onc.
package main

import "github.com/onc-net/onc/cni"

func main() { cni.Main() }
