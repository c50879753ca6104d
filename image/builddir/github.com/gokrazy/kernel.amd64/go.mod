module gokrazy/build/nftgate

go 1.26.8

require github.com/gokrazy/kernel.amd64 v0.0.0-20260705070735-de680abf072b // indirect
