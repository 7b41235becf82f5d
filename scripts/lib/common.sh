# Shared by scripts/*: install the Debian packages zrt needs, configure and build.
# Every package here is used by the build or the suite; add one only together with its first use.
# (python3-torch: the reference examples/gpt is checked against, and the peer scripts/bench measures;
# run with /usr/bin/python3, the interpreter Debian installs it for, whatever python3 comes first on
# PATH. libopenblas-dev and the fortunes texts: examples/gpt. pybind11-dev and python3-dev: the Python
# module, python/. iproute2: ip and tc for the emulated nodes, scripts/cluster.)
ZRT_PACKAGES=(cmake g++ make pkg-config libgtest-dev libopenmpi-dev openmpi-bin nlohmann-json3-dev libcli11-dev
              liburing-dev libzstd-dev libxxhash-dev wamerican clang libclang-rt-14-dev
              libhdf5-dev python3-h5py libopenblas-dev fortunes fortunes-min python3-torch pybind11-dev python3-dev
              iproute2)

zrt_root() { cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd; }

# Installs whatever of ZRT_PACKAGES (plus "$@") is missing; apt-get update only when needed.
zrt_ensure_packages() {
  local missing=() p
  for p in "${ZRT_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "zrt: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# zrt_build DIR [cmake args...]: configure (once) and build with every core.
zrt_build() {
  local dir=$1; shift
  cmake -S "$(zrt_root)" -B "$dir" -DZRT_WERROR=ON "$@"
  cmake --build "$dir" -j "$(nproc)"
}

# Open MPI as root and on a small shared machine (ranks may outnumber cores).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
