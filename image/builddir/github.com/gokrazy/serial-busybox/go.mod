module gokrazy/build/nftgate

go 1.26.8

require github.com/gokrazy/serial-busybox v0.0.0-20250119153030-ac58ba7574e7 // indirect
