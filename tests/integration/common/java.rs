//! Java programs of the test tree (a RocksJava application, a Flink job), compiled against
//! the Flink distribution's jars, which bring Flink and RocksJava (FRocksDB, in flink-dist).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory of the Flink distribution's jars: from `CKPTFS_FLINK_LIB` (scripts/test
/// sets it), else found where pip put apache-flink-libraries.
pub fn flink_lib() -> PathBuf {
    if let Ok(lib) = std::env::var("CKPTFS_FLINK_LIB") {
        return lib.into();
    }
    let script = "import glob, os, pyflink\n\
dirs = [os.path.join(d, 'lib') for d in pyflink.__path__]\n\
print(next(d for d in dirs if glob.glob(os.path.join(d, 'flink-dist*.jar'))))\n";
    let out = Command::new("python3")
        .args(["-c", script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Flink jars are missing: run `. scripts/env.sh; ckptfs_install_flink_jars` \
         (pip install --no-deps apache-flink-libraries==2.3.0): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().into()
}

/// `source` (relative to the repository) compiled into `classes`; the class path to run
/// it with.
pub fn compile_java(source: &str, classes: &Path) -> String {
    let lib = flink_lib();
    let out = Command::new("javac")
        .args(["-nowarn", "-cp", &format!("{}/*", lib.display()), "-d"])
        .arg(classes)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(source))
        // No hsperfdata in /tmp.
        .arg("-J-XX:-UsePerfData")
        .output()
        .expect("javac (openjdk-17-jdk-headless; scripts/test installs it)");
    assert!(
        out.status.success(),
        "javac {source}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!("{}/*:{}", lib.display(), classes.display())
}

/// A directory for a JVM's temporary files, removed when dropped: a Flink mini cluster's
/// working directory (`minicluster_*`, some 31 MB, which a killed JVM never removes),
/// RocksDB's unpacked native library, Flink's blobs and spill files. Drop it after the JVM
/// has exited (declare it before the process's guard).
pub struct JavaTmp(tempfile::TempDir);

impl JavaTmp {
    /// A new one, empty.
    pub fn new() -> JavaTmp {
        JavaTmp(
            tempfile::Builder::new()
                .prefix("ckptfs-java-")
                .tempdir()
                .unwrap(),
        )
    }

    /// `java`, its temporary files in this directory (`java.io.tmpdir`, which Flink's
    /// `io.tmp.dirs` defaults to) and none in /tmp (no hsperfdata).
    pub fn java(&self) -> Command {
        let mut java = Command::new("java");
        java.arg(format!("-Djava.io.tmpdir={}", self.0.path().display()))
            .arg("-XX:-UsePerfData");
        java
    }
}
