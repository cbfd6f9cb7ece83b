// Command sluice-image writes sluice's container image as an OCI image
// archive (the layout podman, skopeo and containerd load) without a
// registry or a container engine: a base layer from a root filesystem
// tarball (Debian's, made by mmdebstrap; see scripts/build-image.sh) and a
// layer holding sluice at /usr/local/bin/sluice, with kube-proxy's path
// linked to it so that kube-proxy's DaemonSet runs it unchanged. Every
// timestamp is --epoch and every gzip header is empty, so the same inputs
// give the same bytes.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

func main() {
	rootfs := flag.String("rootfs", "", "root filesystem tarball for the base layer")
	binary := flag.String("binary", "", "the sluice binary (static)")
	out := flag.String("out", "", "where to write the OCI archive")
	ref := flag.String("ref", "localhost/sluice:latest", "the image's name, recorded in the archive's index")
	version := flag.String("version", "dev", "sluice's version, for the image's labels")
	epoch := flag.Int64("epoch", 0, "timestamp for every file and the image (SOURCE_DATE_EPOCH)")
	flag.Parse()
	if *rootfs == "" || *binary == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "sluice-image: --rootfs, --binary and --out are required")
		os.Exit(2)
	}
	if err := build(*rootfs, *binary, *out, *ref, *version, time.Unix(*epoch, 0).UTC()); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-image:", err)
		os.Exit(1)
	}
}

// blob is one content-addressed file of the layout.
type blob struct {
	digest string
	data   []byte
}

func newBlob(data []byte) blob {
	sum := sha256.Sum256(data)
	return blob{digest: "sha256:" + hex.EncodeToString(sum[:]), data: data}
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func (b blob) describe(mediaType string) descriptor {
	return descriptor{MediaType: mediaType, Digest: b.digest, Size: len(b.data)}
}

// layer gzips an uncompressed layer tarball; it returns the compressed
// blob and the uncompressed digest (the config's diff_id).
func layer(tarball []byte) (blob, string, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return blob{}, "", err
	}
	if _, err := zw.Write(tarball); err != nil {
		return blob{}, "", err
	}
	if err := zw.Close(); err != nil {
		return blob{}, "", err
	}
	return newBlob(buf.Bytes()), newBlob(tarball).digest, nil
}

// sluiceLayer is /usr/local/bin/sluice and the kube-proxy link to it.
func sluiceLayer(binary string, at time.Time) ([]byte, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: at, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "usr/local/bin/sluice", Mode: 0o755, Size: int64(len(bin)), ModTime: at, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "usr/local/bin/kube-proxy", Linkname: "sluice", Mode: 0o777, ModTime: at, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func build(rootfs, binary, out, ref, version string, at time.Time) error {
	base, err := os.ReadFile(rootfs)
	if err != nil {
		return err
	}
	baseBlob, baseDiff, err := layer(base)
	if err != nil {
		return err
	}
	top, err := sluiceLayer(binary, at)
	if err != nil {
		return err
	}
	topBlob, topDiff, err := layer(top)
	if err != nil {
		return err
	}
	created := at.Format(time.RFC3339)
	config, err := json.Marshal(map[string]any{
		"created":      created,
		"architecture": "amd64",
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": []string{"/usr/local/bin/sluice"},
			"Env":        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"Labels": map[string]string{
				"org.opencontainers.image.title":   "sluice",
				"org.opencontainers.image.version": version,
			},
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{baseDiff, topDiff}},
		"history": []map[string]any{
			{"created": created, "created_by": "mmdebstrap: Debian with iptables (nft and legacy), ipset, nftables, conntrack, kmod"},
			{"created": created, "created_by": "sluice-image: /usr/local/bin/sluice, kube-proxy -> sluice"},
		},
	})
	if err != nil {
		return err
	}
	configBlob := newBlob(config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configBlob.describe("application/vnd.oci.image.config.v1+json"),
		"layers": []descriptor{
			baseBlob.describe("application/vnd.oci.image.layer.v1.tar+gzip"),
			topBlob.describe("application/vnd.oci.image.layer.v1.tar+gzip"),
		},
	})
	if err != nil {
		return err
	}
	manifestBlob := newBlob(manifest)
	md := manifestBlob.describe("application/vnd.oci.image.manifest.v1+json")
	md.Annotations = map[string]string{"org.opencontainers.image.ref.name": ref}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []descriptor{md}})
	if err != nil {
		return err
	}

	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: at, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/", Mode: 0o755, ModTime: at, Format: tar.FormatPAX}); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/sha256/", Mode: 0o755, ModTime: at, Format: tar.FormatPAX}); err != nil {
		return err
	}
	for _, b := range []blob{baseBlob, topBlob, configBlob, manifestBlob} {
		if err := add(filepath.Join("blobs/sha256", b.digest[len("sha256:"):]), b.data); err != nil {
			return err
		}
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := add("index.json", index); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Printf("%s %s (%d MB compressed)\n", out, manifestBlob.digest, (len(baseBlob.data)+len(topBlob.data))>>20)
	return os.Rename(tmp, out)
}
