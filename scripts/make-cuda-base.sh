#!/usr/bin/env bash
# Make CUDA base images for Dockerfile.llamacpp without an image registry: a Debian bookworm base (debootstrap, as
# .ci/run makes local/bookworm:base) plus NVIDIA's CUDA wheels from PyPI, pinned by version and sha256 in
# docker/cuda-base/wheels.txt, laid out as a CUDA toolkit under /usr/local/cuda-X.Y (/usr/local/cuda links to it).
#
#   scripts/make-cuda-base.sh [--base IMAGE] [--tag REPO] [--work DIR]
#
# Makes two images (docs/cuda-base.md):
#   REPO:X.Y.Z-devel-bookworm    the build base: nvcc, ptxas, cicc, cudafe++, fatbinary, nvlink, bin2c, headers (CCCL
#                                incl.), libcudart, libcublas, libcublasLt, and a link-time stub lib64/stubs/libcuda.so
#   REPO:X.Y.Z-runtime-bookworm  the runtime base: libcudart, libcublas, libcublasLt
# and prints their ids (also in WORK/cuda-base.json). Use them as
#   docker build -f Dockerfile.llamacpp --build-arg BUILD_BASE=REPO:X.Y.Z-devel-bookworm \
#     --build-arg RUNTIME_BASE=REPO:X.Y.Z-runtime-bookworm --build-arg LLAMA_SOURCE=sdist ... .
# --base: the Debian image to start from (default local/bookworm:base, made here with debootstrap when missing);
# --tag: the images' repository (default local/cuda); --work: where wheels and the build context go (default a
# temporary folder, removed at the end). Needs docker, python3 with pip (PyPI reachable), gcc (for the stub).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pins=$repo/docker/cuda-base/wheels.txt
base=local/bookworm:base tag=local/cuda work=""
while [ $# -gt 0 ]; do
  case $1 in
    --base) base=${2:?}; shift 2 ;;
    --tag) tag=${2:?}; shift 2 ;;
    --work) work=${2:?}; shift 2 ;;
    *) echo "usage: make-cuda-base.sh [--base IMAGE] [--tag REPO] [--work DIR]" >&2; exit 2 ;;
  esac
done
if [ -z "$work" ]; then work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; fi
mkdir -p "$work"

version=$(awk '/^# cuda-toolkit: /{print $3; exit}' "$pins")
[ -n "$version" ] || { echo "error: $pins names no '# cuda-toolkit: X.Y.Z'" >&2; exit 2; }
mm=${version%.*}
major=${mm%%.*}

if ! docker image inspect "$base" >/dev/null 2>&1; then
  [ "$base" = local/bookworm:base ] || { echo "error: base image $base not found" >&2; exit 2; }
  echo "make-cuda-base: making $base with debootstrap"
  mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  rootfs=$work/rootfs
  mkdir -p "$rootfs"
  debootstrap --variant=minbase bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >"$work/debootstrap.log" 2>&1
  tar -C "$rootfs" --exclude='./var/cache/apt/archives/*.deb' --exclude='./var/lib/apt/lists/*' -c . \
    | docker import --change 'ENV LANG=C.UTF-8' - "$base" >/dev/null
  rm -rf "$rootfs"
fi

# 1. the pinned wheels, nothing else: every file checked against its sha256, no dependency resolved
rm -rf "$work/wheels"
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --require-hashes \
  -r "$pins" -d "$work/wheels"
want=$(grep -c '^[a-z].*==.*--hash=sha256:' "$pins")
got=$(find "$work/wheels" -name '*.whl' | wc -l)
[ "$got" = "$want" ] || { echo "error: $got wheels downloaded, $pins pins $want" >&2; exit 2; }

# 2. unpacked (file modes kept: nvcc, cicc & co. are executables) and laid out as NVIDIA's toolkit is
ctx=$work/context
rm -rf "$ctx" "$work/unpacked"
python3 - "$work/wheels" "$work/unpacked" <<'PY'
import sys, zipfile
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for whl in sorted(src.glob("*.whl")):
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            if ".dist-info/" in info.filename or info.filename.endswith("__init__.py") or info.is_dir():
                continue
            out = dst / info.filename
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(info))
            mode = (info.external_attr >> 16) & 0o777
            out.chmod(mode or 0o644)
PY
u=$work/unpacked/nvidia/cu$major
[ -x "$u/bin/nvcc" ] || { echo "error: the pinned wheels hold no nvcc (nvidia/cu$major/bin/nvcc)" >&2; exit 2; }
root=$ctx/devel/usr/local/cuda-$mm
t=$root/targets/x86_64-linux
mkdir -p "$root/bin" "$root/nvvm/lib64" "$t/include" "$t/lib/stubs"
cp -a "$u/bin/." "$root/bin/"
cp -a "$u/nvvm/." "$root/nvvm/"
mv "$u/lib/libnvvm.so."* "$root/nvvm/lib64/"
(cd "$root/nvvm/lib64" && ln -s libnvvm.so.* libnvvm.so)
cp -a "$u/include/." "$t/include/"
cp -a "$u/lib/." "$t/lib/"
ln -s targets/x86_64-linux/include "$root/include"
ln -s targets/x86_64-linux/lib "$root/lib64"
for so in "$t"/lib/lib*.so."$major"; do ln -s "$(basename "$so")" "${so%.$major}"; done
# libcuda.so: the driver's library, absent from every wheel. ggml-cuda links it (CUDA::cuda_driver), so the build
# needs a file to link against, as NVIDIA's devel images have one in lib64/stubs: every cu* name of cuda.h as an
# empty function, SONAME libcuda.so.1. It is never loaded (LIBRARY_PATH only; the GPU host's driver provides it).
grep -o '\bcu[A-Z][A-Za-z0-9_]*\b' "$t/include/cuda.h" | sort -u | sed 's/.*/void &(void) {}/' >"$work/libcuda-stub.c"
gcc -shared -nostdlib -fPIC -Wl,-soname,libcuda.so.1 -o "$t/lib/stubs/libcuda.so" "$work/libcuda-stub.c"
ln -s "cuda-$mm" "$ctx/devel/usr/local/cuda"
mkdir -p "$ctx/devel/etc/ld.so.conf.d"
echo /usr/local/cuda/lib64 >"$ctx/devel/etc/ld.so.conf.d/cuda.conf"
# the runtime base: the libraries llama.cpp's CUDA build links (libcudart, libcublas, libcublasLt) and their links
rt=$ctx/runtime/usr/local/cuda-$mm/targets/x86_64-linux/lib
mkdir -p "$rt" "$ctx/runtime/etc/ld.so.conf.d"
mv "$t"/lib/libcudart.so* "$t"/lib/libcublas.so* "$t"/lib/libcublasLt.so* "$rt/"  # devel builds on runtime
ln -s targets/x86_64-linux/lib "$ctx/runtime/usr/local/cuda-$mm/lib64"
ln -s "cuda-$mm" "$ctx/runtime/usr/local/cuda"
cp "$ctx/devel/etc/ld.so.conf.d/cuda.conf" "$ctx/runtime/etc/ld.so.conf.d/"
cp "$repo/docker/cuda-base/Dockerfile" "$ctx/Dockerfile"

# 3. the two images
ids=()
for target in runtime devel; do
  docker build -q --target "$target" -t "$tag:$version-$target-bookworm" --build-arg "BASE=$base" \
    --build-arg "CUDA_VERSION=$version" --build-arg "CUDA_MAJOR_MINOR=$mm" "$ctx" >/dev/null
  ids+=("$(docker image inspect --format '{{.Id}}' "$tag:$version-$target-bookworm")")
  echo "make-cuda-base: $tag:$version-$target-bookworm ${ids[-1]}"
done
python3 - "$work/cuda-base.json" "$version" "$base" "$(docker image inspect --format '{{.Id}}' "$base")" \
  "$tag:$version-runtime-bookworm" "${ids[0]}" "$tag:$version-devel-bookworm" "${ids[1]}" "$pins" <<'PY'
import json, sys
out, version, base, base_id, rt, rt_id, dev, dev_id, pins = sys.argv[1:]
wheels = [line.split()[0] for line in open(pins) if line[:1].isalpha()]
json.dump({"cuda_toolkit": version, "base": {"image": base, "id": base_id},
           "runtime": {"image": rt, "id": rt_id}, "devel": {"image": dev, "id": dev_id}, "wheels": wheels},
          open(out, "w"), indent=2)
PY
echo "make-cuda-base: $work/cuda-base.json"
