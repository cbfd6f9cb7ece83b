// Package guest holds the tests that run inside the qemu VM (build tag
// vmguest): IPVS mode and SCTP, which this host's kernel lacks. vmtest
// builds them into the VM image and boots it.
package guest
