package model

// CompareAddrPorts lets the tests count the endpoint comparisons of a build.
var CompareAddrPorts = &compareAddrPorts
