// Package ctnetlink holds the numbers of the kernel's conntrack netlink
// interface (include/uapi/linux/netfilter/nfnetlink_conntrack.h,
// nfnetlink.h and nfnetlink_compat.h) that nftgate's own encoders and
// decoders use: the stale-flow cleaner's and the traffic view's (package
// conntrack) and the replica writer's (package statesync); the tuple parser
// and the dump loop both decode entries with.
package ctnetlink

// Subsystem, message types and multicast groups.
const (
	Subsys    = 1 // NFNL_SUBSYS_CTNETLINK
	MsgNew    = 0 // IPCTNL_MSG_CT_NEW
	MsgGet    = 1 // IPCTNL_MSG_CT_GET
	MsgDelete = 2 // IPCTNL_MSG_CT_DELETE

	GroupNew     = 1 // NFNLGRP_CONNTRACK_NEW
	GroupUpdate  = 2 // NFNLGRP_CONNTRACK_UPDATE
	GroupDestroy = 3 // NFNLGRP_CONNTRACK_DESTROY

	NFNetlinkV0 = 0 // NFNETLINK_V0, the version in nfgenmsg
	NFGenMsgLen = 4 // sizeof(struct nfgenmsg)
)

// Attributes of a conntrack entry (enum ctattr_type).
const (
	TupleOrig  = 1  // CTA_TUPLE_ORIG
	TupleReply = 2  // CTA_TUPLE_REPLY
	Status     = 3  // CTA_STATUS
	Protoinfo  = 4  // CTA_PROTOINFO
	NATSrc     = 6  // CTA_NAT_SRC
	Timeout    = 7  // CTA_TIMEOUT
	Mark       = 8  // CTA_MARK
	ID         = 12 // CTA_ID
	NATDst     = 13 // CTA_NAT_DST
	Zone       = 18 // CTA_ZONE
	MarkMask   = 21 // CTA_MARK_MASK
	Filter     = 25 // CTA_FILTER
	StatusMask = 26 // CTA_STATUS_MASK

	CountersOrig  = 9  // CTA_COUNTERS_ORIG
	CountersReply = 10 // CTA_COUNTERS_REPLY
	Timestamp     = 20 // CTA_TIMESTAMP
)

// StatusDstNAT is the IPS_DST_NAT status bit
// (include/uapi/linux/netfilter/nf_conntrack_common.h): the entry's
// destination is translated, as a flow to a Service's is.
const StatusDstNAT uint32 = 1 << 5

// DNATOnly is the dump filter of the entries whose destination is
// translated: the kernel writes no message for the others (routed flows).
var DNATOnly = DumpFilter{Status: StatusDstNAT, StatusMask: StatusDstNAT}

// Nested in CTA_COUNTERS_* and CTA_TIMESTAMP.
const (
	CountersBytes  = 2 // CTA_COUNTERS_BYTES
	TimestampStart = 1 // CTA_TIMESTAMP_START
)

// Nested attributes.
const (
	TupleIP    = 1 // CTA_TUPLE_IP
	TupleProto = 2 // CTA_TUPLE_PROTO

	IPv4Src = 1 // CTA_IP_V4_SRC
	IPv4Dst = 2 // CTA_IP_V4_DST
	IPv6Src = 3 // CTA_IP_V6_SRC
	IPv6Dst = 4 // CTA_IP_V6_DST

	ProtoNum     = 1 // CTA_PROTO_NUM
	ProtoSrcPort = 2 // CTA_PROTO_SRC_PORT
	ProtoDstPort = 3 // CTA_PROTO_DST_PORT

	ProtoinfoTCP        = 1 // CTA_PROTOINFO_TCP
	ProtoinfoTCPState   = 1 // CTA_PROTOINFO_TCP_STATE
	ProtoinfoTCPWScaleO = 2 // CTA_PROTOINFO_TCP_WSCALE_ORIGINAL
	ProtoinfoTCPWScaleR = 3 // CTA_PROTOINFO_TCP_WSCALE_REPLY
	ProtoinfoTCPFlagsO  = 4 // CTA_PROTOINFO_TCP_FLAGS_ORIGINAL
	ProtoinfoTCPFlagsR  = 5 // CTA_PROTOINFO_TCP_FLAGS_REPLY

	ProtoinfoSCTP          = 3 // CTA_PROTOINFO_SCTP
	ProtoinfoSCTPState     = 1 // CTA_PROTOINFO_SCTP_STATE
	ProtoinfoSCTPVTagOrig  = 2 // CTA_PROTOINFO_SCTP_VTAG_ORIGINAL
	ProtoinfoSCTPVTagReply = 3 // CTA_PROTOINFO_SCTP_VTAG_REPLY

	NATV4MinIP = 1 // CTA_NAT_V4_MINIP
	NATV4MaxIP = 2 // CTA_NAT_V4_MAXIP
	NATProto   = 3 // CTA_NAT_PROTO
	NATV6MinIP = 4 // CTA_NAT_V6_MINIP
	NATV6MaxIP = 5 // CTA_NAT_V6_MAXIP

	ProtoNATPortMin = 1 // CTA_PROTONAT_PORT_MIN
	ProtoNATPortMax = 2 // CTA_PROTONAT_PORT_MAX

	FilterOrigFlags  = 1 // CTA_FILTER_ORIG_FLAGS
	FilterReplyFlags = 2 // CTA_FILTER_REPLY_FLAGS
)
