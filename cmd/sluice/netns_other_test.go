//go:build !linux

package main

import "errors"

func inPrivateNetns() bool              { return false }
func reexecInPrivateNetns() (int, bool) { return 0, false }
func setUpPrivateNetns() error          { return nil }
func addLocalAddr(string) error         { return errors.New("private network namespaces need Linux") }

func runHelper() bool { return false }
