#!/usr/bin/env bash
# The GPU machine's image has CUDA, NCCL, CMake and a compiler but not the Debian libraries zrt builds
# against, and it cannot download anything. So:
#   tests/gpu/deps.sh fetch     here (network): downloads the .debs into .gpu-deps/ (git-ignored,
#                               about 25 MiB); the device call carries it (carry: [".gpu-deps"]).
#   source tests/gpu/deps.sh    there (run.sh does it): if .gpu-deps/ exists and the machine lacks
#                               them, unpacks into /tmp/zrt-deps and exports what CMake, pkg-config,
#                               mpirun and the test binaries need; ZRT_DEPS_CMAKE_ARGS holds the
#                               configure arguments.
ZRT_GPU_DEBS=(
  openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libpmix-dev libhwloc15 libhwloc-dev
  libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7 libevent-extra-2.1-7 libevent-openssl-2.1-7 libevent-dev
  libfabric1 libucx0 libibverbs1 libibverbs-dev ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200
  libnl-3-dev libnl-route-3-dev libpsm2-2 libpsm-infinipath1 libmunge2 libnuma1 libnuma-dev libltdl7 libltdl-dev
  liburing2 liburing-dev libzstd-dev libxxhash-dev
  libhdf5-103-1 libhdf5-cpp-103-1 libhdf5-hl-100 libhdf5-hl-cpp-100 libhdf5-dev hdf5-helpers libsz2 libaec0 libaec-dev
  libcurl4 libnghttp2-14 libidn2-0 librtmp1 libssh2-1 libpsl5 libldap-2.5-0 libsasl2-2 libsasl2-modules-db
  libbrotli1 libgnutls30 libhogweed6 libnettle8 libgmp10 libp11-kit0 libtasn1-6 libunistring2 libatomic1
  libjpeg62-turbo libjpeg62-turbo-dev libjpeg-dev libssl-dev zlib1g-dev
  nlohmann-json3-dev libcli11-dev libgtest-dev googletest pkgconf pkgconf-bin libpkgconf3)

if [ "${1:-}" = fetch ]; then
  set -euo pipefail
  cd "$(dirname "${BASH_SOURCE[0]}")/../.."
  rm -rf .gpu-deps && mkdir -p .gpu-deps
  (cd .gpu-deps && apt-get download "${ZRT_GPU_DEBS[@]}" 2>&1 | grep -v "^Get:\|^Fetched\|unsandboxed" || true)
  echo "tests/gpu/deps.sh: $(ls .gpu-deps/*.deb | wc -l) packages, $(du -sh .gpu-deps | cut -f1) in .gpu-deps/"
  exit 0
fi

# Sourced: use the carried packages only where the machine lacks them.
ZRT_DEPS_CMAKE_ARGS=()
if [ -d .gpu-deps ] && ! { command -v mpirun && pkg-config --exists liburing libzstd libxxhash hdf5; } >/dev/null 2>&1; then
  p=/tmp/zrt-deps
  if [ ! -d "$p/usr" ]; then
    mkdir -p "$p"
    for f in .gpu-deps/*.deb; do
      if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$f" "$p"; else ar p "$f" data.tar.xz | tar -xJ -C "$p"; fi
    done
    # What Debian's maintainer scripts would do: the alternatives links.
    ln -sf hdf5-serial.pc "$p/usr/lib/x86_64-linux-gnu/pkgconfig/hdf5.pc"
    for t in mpirun mpiexec mpicc mpicxx; do ln -sf "$t.openmpi" "$p/usr/bin/$t"; done
    ln -sf pkgconf "$p/usr/bin/pkg-config"
  fi
  lib=$p/usr/lib/x86_64-linux-gnu
  export PATH=$p/usr/bin:$PATH
  export OPAL_PREFIX=$p/usr                      # relocated Open MPI finds its components and help files
  export LD_LIBRARY_PATH=$lib:$lib/openmpi/lib:$lib/hdf5/serial${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_SYSROOT_DIR=$p              # the .pc files say /usr/...
  export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$p/usr/share/pkgconfig
  export PKG_CONFIG=$p/usr/bin/pkgconf
  ZRT_DEPS_CMAKE_ARGS=(
    -DCMAKE_PREFIX_PATH="$p/usr;$lib/cmake"
    -DPKG_CONFIG_EXECUTABLE="$p/usr/bin/pkgconf"
    -DMPIEXEC_EXECUTABLE="$p/usr/bin/mpirun"
    -DMPI_CXX_COMPILER="$p/usr/bin/mpicxx.openmpi"
    -DMPI_CXX_ADDITIONAL_INCLUDE_DIRS="$lib/openmpi/include"
    -DMPI_CXX_LIB_NAMES="mpi"
    -DMPI_mpi_LIBRARY="$lib/openmpi/lib/libmpi.so")
  echo "deps: using the carried Debian packages under $p"
fi

# NCCL: under /usr/local/cuda where the toolkit ships it, else PyTorch's pip package (nvidia-nccl-*).
if [ ! -e /usr/local/cuda/include/nccl.h ]; then
  nccl=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  if [ -n "$nccl" ] && [ -e "$nccl/include/nccl.h" ]; then
    ZRT_DEPS_CMAKE_ARGS+=(-DZRT_NCCL_INCLUDE_DIR="$nccl/include" -DZRT_NCCL_LIBRARY="$(ls "$nccl"/lib/libnccl.so* | head -1)")
    export LD_LIBRARY_PATH=$nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "deps: NCCL from $nccl"
  fi
fi

# nvcc: on PATH or under /usr/local/cuda, else the CUDA toolkit's pip package (nvidia-cuda-nvcc-*).
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  for d in $(python3 -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null); do
    nvcc=$(find "$d" -path '*/bin/nvcc' -type f 2>/dev/null | head -1)
    if [ -n "$nvcc" ]; then
      ZRT_DEPS_CMAKE_ARGS+=(-DCMAKE_CUDA_COMPILER="$nvcc")
      echo "deps: nvcc from $nvcc"
      break
    fi
  done
fi
