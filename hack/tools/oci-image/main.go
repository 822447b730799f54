// oci-image packs files into a single-layer container image and writes it as
// an image archive that `ctr images import` (and `docker load`) accept, so the
// project's images can be built and run without a Docker engine or a registry.
//
//	oci-image --out haltsql.tar --tag haltsql.local/haltsql:dev \
//	  --entrypoint /usr/local/bin/haltsql --cmd --help --user 65532:65532 \
//	  --label org.opencontainers.image.title=haltsql \
//	  --file target/release/haltsql:/usr/local/bin/haltsql:0755 --dir /tmp:1777
//
// The image layout, digests and archive format come from go-containerregistry;
// this program only decides what goes into the one layer and the config.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

// entry is one file or directory of the layer.
type entry struct {
	dest string
	src  string // empty for a directory
	mode int64
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "oci-image: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var out, tag, user, workdir string
	var entrypoint, cmd, labels, env, files, dirs list
	flag.StringVar(&out, "out", "", "the image archive to write")
	flag.StringVar(&tag, "tag", "", "the image reference recorded in the archive (NAME:TAG)")
	flag.StringVar(&user, "user", "", "the user the container runs as (UID:GID)")
	flag.StringVar(&workdir, "workdir", "/", "the working directory")
	flag.Var(&entrypoint, "entrypoint", "an entrypoint word (repeat for more)")
	flag.Var(&cmd, "cmd", "a default argument (repeat for more)")
	flag.Var(&labels, "label", "KEY=VALUE image label (repeatable)")
	flag.Var(&env, "env", "KEY=VALUE environment variable (repeatable)")
	flag.Var(&files, "file", "SRC:DEST[:MODE] a file of the layer, MODE octal (default 0644)")
	flag.Var(&dirs, "dir", "DEST[:MODE] a directory of the layer, MODE octal (default 0755)")
	flag.Parse()
	if out == "" || tag == "" || len(files) == 0 {
		return fmt.Errorf("--out, --tag and at least one --file are required")
	}
	ref, err := name.NewTag(tag, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("--tag %q: %w", tag, err)
	}

	var entries []entry
	for _, f := range files {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return fmt.Errorf("--file %q: expected SRC:DEST[:MODE]", f)
		}
		mode, err := parseMode(parts, 0o644)
		if err != nil {
			return fmt.Errorf("--file %q: %w", f, err)
		}
		entries = append(entries, entry{dest: parts[1], src: parts[0], mode: mode})
	}
	for _, d := range dirs {
		parts := append([]string{""}, strings.Split(d, ":")...)
		if len(parts) > 3 {
			return fmt.Errorf("--dir %q: expected DEST[:MODE]", d)
		}
		mode, err := parseMode(parts, 0o755)
		if err != nil {
			return fmt.Errorf("--dir %q: %w", d, err)
		}
		entries = append(entries, entry{dest: parts[1], mode: mode})
	}
	layerTar, err := buildLayer(entries)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	labelMap := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("--label %q: expected KEY=VALUE", l)
		}
		labelMap[k] = v
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = "amd64"
	cfg.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cfg.Config = v1.Config{
		Entrypoint: entrypoint,
		Cmd:        cmd,
		User:       user,
		Labels:     labelMap,
		Env:        append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, env...),
		WorkingDir: workdir,
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	return os.Rename(tmp, out)
}

func parseMode(parts []string, def int64) (int64, error) {
	if len(parts) < 3 {
		return def, nil
	}
	m, err := strconv.ParseInt(parts[2], 8, 32)
	if err != nil || m < 0 || m > 0o7777 {
		return 0, fmt.Errorf("mode %q is not an octal file mode", parts[2])
	}
	return m, nil
}

// buildLayer writes the entries, with every parent directory, as one tar
// stream owned by root with a fixed time, so equal inputs give equal digests.
func buildLayer(entries []entry) ([]byte, error) {
	epoch := time.Unix(0, 0).UTC()
	byPath := map[string]entry{}
	for _, e := range entries {
		clean := strings.TrimPrefix(path.Clean("/"+e.dest), "/")
		if clean == "" || strings.HasPrefix(clean, "..") {
			return nil, fmt.Errorf("destination %q is not a path inside the image", e.dest)
		}
		e.dest = clean
		byPath[clean] = e
		for dir := path.Dir(clean); dir != "." && dir != "/"; dir = path.Dir(dir) {
			if _, ok := byPath[dir]; !ok {
				byPath[dir] = entry{dest: dir, mode: 0o755}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := byPath[p]
		hdr := &tar.Header{Name: p, Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}
		var data []byte
		if e.src == "" {
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		} else {
			var err error
			if data, err = os.ReadFile(e.src); err != nil {
				return nil, err
			}
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
