//go:build !linux

package listeners

const msgTrunc = 0x20 // MSG_TRUNC on BSDs and Darwin; Windows reports truncation as an error
