# Shared setup for the scripts: system packages, a persistent cargo target directory.
# Source it; it changes nothing that is already in place.

: "${CARGO_TARGET_DIR:=$HOME/.cache/ckptfs-target}"
export CARGO_TARGET_DIR

# Install the Debian packages ckptfs needs to build and test, if any is missing:
# libclang-dev (bindgen for librocksdb-sys), fuse3 (fusermount3), rocksdb-tools (ldb 7.8,
# used to prove checkpoints open in older RocksDB), graphviz (ckptfs graph --format svg),
# systemd (systemd-analyze checks scripts/ckptfs.service), btrfs-progs (a live database on a
# btrfs subvolume, whose files' st_dev is not the device /proc/locks names), bsdutils
# (script: a pseudo-terminal for the progress bars' test), awscli and rclone (the S3
# door's clients in tests/integration/s3door.rs), nginx-light (what scripts/bench-s3-door
# compares the door with), b3sum (scripts/bench-local's read-and-hash bound).
ckptfs_install_packages() {
    local wanted=(libclang-dev fuse3 rocksdb-tools graphviz systemd pkg-config faketime btrfs-progs chromium bsdutils awscli rclone nginx-light b3sum "$@")
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

# The Flink jars (apache-flink-libraries, a PyPI wheel that ships them) and a JDK: the
# RocksJava classes and native library (FRocksDB 8.10) inside flink-dist-*.jar run the Java
# application tests/java/RocksCheckpoints.java, which makes checkpoints for ckptfs import.
# Exports CKPTFS_FLINK_LIB, the absolute directory holding the jars.
ckptfs_install_flink_jars() {
    if ! command -v javac >/dev/null 2>&1; then
        echo "installing: openjdk-17-jdk-headless" >&2
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openjdk-17-jdk-headless >/dev/null
    fi
    if ! python3 -c 'import pyflink' 2>/dev/null; then
        python3 -m pip install -q --no-deps 'apache-flink-libraries==2.3.0' 2>/dev/null \
            || python3 -m pip install -q --no-deps --break-system-packages 'apache-flink-libraries==2.3.0'
    fi
    local lib
    # apache-flink-libraries alone makes pyflink a namespace package (no __init__.py, so
    # pyflink.__file__ is None): look through pyflink.__path__ for the lib/ with the jars.
    lib="$(python3 -c '
import glob, os, pyflink
dirs = [os.path.join(d, "lib") for d in pyflink.__path__]
print(next((d for d in dirs if glob.glob(os.path.join(d, "flink-dist*.jar"))), dirs[0]))
')" || {
        echo "ckptfs_install_flink_jars: pyflink not importable after installing apache-flink-libraries" >&2
        return 1
    }
    if [ ! -d "$lib" ] || ! compgen -G "$lib/flink-dist*.jar" >/dev/null; then
        echo "ckptfs_install_flink_jars: no flink-dist*.jar in $lib" >&2
        return 1
    fi
    CKPTFS_FLINK_LIB="$lib"
    export CKPTFS_FLINK_LIB
}
