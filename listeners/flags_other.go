//go:build !linux

package listeners

const msgTrunc = 0x20 // MSG_TRUNC on BSDs and Darwin; Windows reports truncation as an error

// goConnFDs is what one goroutine-engine TCP connection holds: its two
// sockets (no splice off Linux).
const goConnFDs = 2
