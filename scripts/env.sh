# Shared setup for the scripts: system packages, a persistent cargo target directory.
# Source it; it changes nothing that is already in place.

: "${CARGO_TARGET_DIR:=$HOME/.cache/ckptfs-target}"
export CARGO_TARGET_DIR

# Install the Debian packages ckptfs needs to build and test, if any is missing:
# libclang-dev (bindgen for librocksdb-sys), fuse3 (fusermount3), rocksdb-tools (ldb 7.8,
# used to prove checkpoints open in older RocksDB), graphviz (ckptfs graph --format svg),
# systemd (systemd-analyze checks scripts/ckptfs.service).
ckptfs_install_packages() {
    local wanted=(libclang-dev fuse3 rocksdb-tools graphviz systemd pkg-config faketime "$@")
    local missing=()
    for pkg in "${wanted[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "installing: ${missing[*]}" >&2
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        echo "cargo not found: install Rust first (https://rustup.rs)" >&2
        return 1
    fi
}

# The Python binding rocksdict, to prove checkpoints open in the RocksDB it bundles.
ckptfs_install_rocksdict() {
    python3 -c 'import rocksdict' 2>/dev/null && return 0
    python3 -m pip install -q rocksdict 2>/dev/null \
        || python3 -m pip install -q --break-system-packages rocksdict
}

# moto_server (Python package moto[server]): the S3-compatible server the object-storage
# tests (tests/integration/object_storage.rs, fencing.rs) start on 127.0.0.1.
ckptfs_install_moto() {
    command -v moto_server >/dev/null 2>&1 && python3 -c 'import moto' 2>/dev/null && return 0
    python3 -m pip install -q 'moto[server]' 2>/dev/null \
        || python3 -m pip install -q --break-system-packages 'moto[server]'
    # pyenv keeps console scripts behind shims that need a rehash.
    command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
}

# prometheus_client (Python): its reference OpenMetrics parser reads the daemon's metrics
# in tests/integration/metrics.rs.
ckptfs_install_prometheus_client() {
    python3 -c 'import prometheus_client.openmetrics.parser' 2>/dev/null && return 0
    python3 -m pip install -q prometheus_client 2>/dev/null \
        || python3 -m pip install -q --break-system-packages prometheus_client
}
