module github.com/nftgate/nftgate

go 1.26.8
