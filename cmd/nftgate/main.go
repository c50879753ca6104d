// Command nftgate is the edge gateway for a Kubernetes cluster.
package main

import "fmt"

func main() { fmt.Println("nftgate") }
