//! The command-line side of a mount: start the daemon in the background, talk to it
//! through `.ckptfs/ctl` and `.ckptfs/status`, unmount it.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant, UNIX_EPOCH};

use ckptfs_core::error::{Error, IoContext};
use ckptfs_core::names::BackendName;
use ckptfs_core::percent;
use ckptfs_core::store::Location;
use ckptfs_core::views::{CheckpointRow, Status, StoreStatus};

const NOTIFY_ENV: &str = "CKPTFS_NOTIFY_READY";

/// Re-run this command with `--foreground` as a detached daemon, and return once it says
/// the mount is ready (exit 0) or why it is not (exit 1).
pub fn daemonize(
    store: &ckptfs_core::store::Location,
    state: Option<&Path>,
    read_only: bool,
    log_file: Option<&Path>,
    args: &[std::ffi::OsString],
) -> Result<ExitCode, Error> {
    let default_dir = match (store.local(), state) {
        (Some(root), _) if !read_only => ckptfs_core::repo::ensure_store_dir(root)?,
        (_, Some(state)) => {
            ckptfs_core::fsutil::create_private_dir_all(state)?;
            state.to_path_buf()
        }
        (_, None) => {
            return Err(Error::Invalid(format!(
                "a store on object storage ({store}) needs --state DIR: a local directory \
                 for the live databases and the read cache"
            )))
        }
    };
    let log_path = log_file
        .map(Path::to_path_buf)
        .unwrap_or_else(|| default_dir.join(ckptfs_core::store::layout::LOG));
    let log = ckptfs_core::fsutil::open_private()
        .create(true)
        .append(true)
        .open(&log_path)
        .ctx("open log file", &log_path)?;
    let exe = std::env::current_exe().map_err(|e| Error::io("find own executable", e))?;
    let mut command = std::process::Command::new(exe);
    command
        .args(args)
        .arg("--foreground")
        .env(NOTIFY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our terminal.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| Error::io("start the daemon", e))?;
    let stdout = child.stdout.take().expect("piped");
    let mut stdout = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        stdout
            .read_line(&mut line)
            .map_err(|e| Error::io("wait for the daemon", e))?;
        // What the daemon says while it starts (e.g. that it waits for a lease).
        match line.trim_end().strip_prefix("note: ") {
            Some(note) => eprintln!("ckptfs: {note}"),
            None => break,
        }
    }
    let line = line.trim_end();
    if line == "ready" {
        eprintln!(
            "ckptfs: mounted (daemon pid {}, log {})",
            child.id(),
            log_path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let _ = child.wait();
    let message = line.strip_prefix("error: ").unwrap_or(line);
    if message.is_empty() {
        eprintln!(
            "ckptfs: error: the daemon exited before the mount was ready; see {}",
            log_path.display()
        );
    } else {
        eprintln!("ckptfs: error: {message}");
    }
    Ok(ExitCode::from(1))
}

/// Tell a waiting `ckptfs mount` (our parent) something while the daemon starts.
pub fn notify_note(note: &str) {
    if std::env::var_os(NOTIFY_ENV).is_none() {
        return;
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "note: {}", note.replace('\n', " "));
    let _ = out.flush();
}

/// Tell a waiting `ckptfs mount` (our parent) whether the mount is ready, then stop
/// writing to the pipe so the parent can exit.
pub fn notify_ready(result: ckptfs_core::Result<()>) {
    if std::env::var_os(NOTIFY_ENV).is_none() {
        return;
    }
    let mut out = std::io::stdout();
    let _ = match &result {
        Ok(()) => writeln!(out, "ready"),
        Err(e) => writeln!(out, "error: {e}"),
    };
    let _ = out.flush();
    if let Ok(null) = OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto fd 1 replaces our stdout with /dev/null; both fds are valid.
        unsafe {
            libc::dup2(null.as_raw_fd(), 1);
        }
    }
}

fn ctl_path(mountpoint: &Path) -> PathBuf {
    mountpoint.join(".ckptfs").join("ctl")
}

fn not_a_mount(mountpoint: &Path, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        Error::NotFound(format!(
            "{} is not a ckptfs mount (no .ckptfs/ctl); mount it with `ckptfs mount STORE {}`",
            mountpoint.display(),
            mountpoint.display()
        ))
    } else {
        Error::io(format!("open {}", ctl_path(mountpoint).display()), e)
    }
}

/// Send command lines in one write and read one answer per command.
pub fn requests(mountpoint: &Path, lines: &[String]) -> Result<Vec<serde_json::Value>, Error> {
    let path = ctl_path(mountpoint);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| not_a_mount(mountpoint, e))?;
    let mut text = lines.join("\n");
    text.push('\n');
    let write = (&file).write_all(text.as_bytes());
    let mut reader = BufReader::new(&file);
    let mut answers = Vec::new();
    let expected = if write.is_ok() { lines.len() } else { 1 };
    for _ in 0..expected {
        let mut line = String::new();
        reader.read_line(&mut line).ctx("read answer from", &path)?;
        if line.is_empty() {
            break;
        }
        let value: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| Error::Corrupt(format!("unreadable answer {line:?}: {e}")))?;
        if value["ok"] != true {
            let message = value["error"]
                .as_str()
                .unwrap_or("command failed")
                .to_string();
            return Err(if value["errno"] == libc::EBUSY {
                Error::Busy(message)
            } else {
                Error::Invalid(message)
            });
        }
        answers.push(value);
    }
    write.ctx("write to", &path)?;
    Ok(answers)
}

pub fn request(mountpoint: &Path, line: &str) -> Result<serde_json::Value, Error> {
    requests(mountpoint, &[line.to_string()])?
        .pop()
        .ok_or_else(|| Error::Corrupt("the daemon gave no answer".into()))
}

/// Like [`request`], but a busy answer (a checkpoint slot taken) is retried until `wait`
/// has passed.
pub fn request_retrying_busy(
    mountpoint: &Path,
    line: &str,
    wait: Duration,
) -> Result<serde_json::Value, Error> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(20);
    loop {
        match request(mountpoint, line) {
            Err(Error::Busy(_)) if Instant::now() + pause < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// The text of `.ckptfs/NAME` of a mount.
fn read_meta_file(mountpoint: &Path, name: &str) -> Result<String, Error> {
    let path = mountpoint.join(".ckptfs").join(name);
    let mut text = String::new();
    std::fs::File::open(&path)
        .map_err(|e| not_a_mount(mountpoint, e))?
        .read_to_string(&mut text)
        .ctx("read", &path)?;
    Ok(text)
}

fn read_status(mountpoint: &Path) -> Result<Status, Error> {
    serde_json::from_str(&read_meta_file(mountpoint, "status")?)
        .map_err(|e| Error::Corrupt(format!("unreadable status: {e}")))
}

fn when(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// Every retained checkpoint, from `.ckptfs/checkpoints` (one JSON line each).
fn read_checkpoints(mountpoint: &Path) -> Result<Vec<CheckpointRow>, Error> {
    read_meta_file(mountpoint, "checkpoints")?
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .map_err(|e| Error::Corrupt(format!("unreadable checkpoint list: {e}")))
        })
        .collect()
}

/// What `ls`, `status` and `graph` read: a mount (its daemon's view) or a store (a
/// directory or a URL, read directly, without a daemon).
enum Target {
    Mount(PathBuf),
    Store(Location),
}

fn target(arg: &Path) -> Result<Target, Error> {
    if arg.join(".ckptfs/status").exists() {
        return Ok(Target::Mount(arg.to_path_buf()));
    }
    let text = arg
        .to_str()
        .ok_or_else(|| Error::Invalid(format!("{} is not valid UTF-8", arg.display())))?;
    let location = Location::parse(text)?;
    if let Location::Local(dir) = &location {
        if ckptfs_core::repo::check_is_store(dir).is_err() {
            return Err(Error::NotFound(format!(
                "{} is not a ckptfs mount (no .ckptfs/ctl), nor a ckptfs store (no ckptfs.json, \
                 no checkpoints/); mount a store there with `ckptfs mount STORE {}`",
                dir.display(),
                dir.display()
            )));
        }
    }
    Ok(Target::Store(location))
}

/// The checkpoints of a store read directly, as `.ckptfs/checkpoints` shows them.
fn store_checkpoints(
    location: &Location,
) -> Result<(ckptfs_core::repo::Repo, Vec<ckptfs_core::catalog::Manifest>), Error> {
    let repo = ckptfs_core::repo::Repo::reader(location)?;
    let manifests = repo.catalog.load_all()?.into_values().collect();
    Ok((repo, manifests))
}

pub fn ls(path: &Path, json: bool) -> Result<ExitCode, Error> {
    let (checkpoints, external) = match target(path)? {
        Target::Mount(mountpoint) => (
            read_checkpoints(&mountpoint)?,
            read_status(&mountpoint)?.external,
        ),
        Target::Store(location) => {
            let (repo, manifests) = store_checkpoints(&location)?;
            let external = repo
                .catalog
                .load_meta()?
                .map(|m| m.external.iter().map(|b| b.to_string()).collect())
                .unwrap_or_default();
            (manifests.iter().map(CheckpointRow::of).collect(), external)
        }
    };
    if json {
        let text = serde_json::to_string(&checkpoints)
            .map_err(|e| Error::Invalid(format!("cannot write the list as JSON: {e}")))?;
        println!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>6}  {:<20}  {:>6}  {:>12}  {:>12}  {:>9}  {:>9}",
        "ID", "COMPLETED", "FILES", "BYTES", "UPLOADED", "SYNC_MS", "ASYNC_MS"
    );
    for c in checkpoints {
        println!(
            "{:>6}  {:<20}  {:>6}  {:>12}  {:>12}  {:>9.1}  {:>9.1}",
            c.id,
            when(c.completed_unix_ms),
            c.files,
            c.bytes,
            c.bytes_uploaded,
            c.sync_ms,
            c.async_ms,
        );
    }
    if !external.is_empty() {
        println!("external backends (imported): {}", external.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

/// `status` of a store without a daemon: its settings, checkpoints, size and, on object
/// storage, who holds its lease.
fn store_status(location: &Location) -> Result<StoreStatus, Error> {
    let (repo, manifests) = store_checkpoints(location)?;
    let meta = repo.catalog.load_meta()?;
    let lease = ckptfs_core::lease::holder(repo.records.as_ref())?;
    Ok(StoreStatus::build(
        location,
        meta.as_ref(),
        &manifests,
        lease,
    ))
}

/// Runs of consecutive ids as text: "1-9999 10001".
fn runs_text(runs: &[[u64; 2]]) -> String {
    runs.iter()
        .map(|[a, b]| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn status(path: &Path, json: bool) -> Result<ExitCode, Error> {
    match target(path)? {
        Target::Mount(mountpoint) => {
            let status = read_status(&mountpoint)?;
            if json {
                print!("{}", ckptfs_core::views::to_pretty_text(&status));
            } else {
                print_daemon_status(&status);
            }
        }
        Target::Store(location) => {
            let status = store_status(&location)?;
            if json {
                print!("{}", ckptfs_core::views::to_pretty_text(&status));
            } else {
                print_store_status(&status);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Hosted backends, then the imported ones marked `(external)`.
fn backends_text(hosted: &[String], external: &[String]) -> String {
    hosted
        .iter()
        .cloned()
        .chain(external.iter().map(|b| format!("{b} (external)")))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_daemon_status(status: &Status) {
    println!("store:       {}", status.store);
    println!("daemon pid:  {}", status.pid);
    println!(
        "backends:    {}",
        backends_text(&status.backends, &status.external)
    );
    println!(
        "checkpoints: {} ({} retained, retain {})",
        runs_text(&status.checkpoint_runs),
        status.checkpoints_total,
        status.retain
    );
    println!(
        "in flight:   {}",
        serde_json::to_string(&status.in_flight).unwrap_or_default()
    );
    println!(
        "store size:  {} bytes in {} objects",
        status.store_bytes, status.objects
    );
    if let Some(e) = &status.last_error {
        println!("last error:  {e}");
    }
}

fn print_store_status(status: &StoreStatus) {
    println!("store:       {}", status.store);
    let now = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    match &status.lease {
        Some(lease) if lease.expires_unix_ms > now => println!(
            "writer:      {} (lease until {})",
            lease.holder,
            when(lease.expires_unix_ms)
        ),
        _ => println!("writer:      none (read directly from the store)"),
    }
    println!(
        "backends:    {}",
        backends_text(
            status.backends.as_deref().unwrap_or_default(),
            &status.external
        )
    );
    println!(
        "checkpoints: {} ({} retained, retain {})",
        runs_text(&status.checkpoint_runs),
        status.checkpoints_total,
        status
            .retain
            .map_or_else(|| "unknown".to_string(), |r| r.to_string())
    );
    println!(
        "store size:  {} bytes in {} objects",
        status.store_bytes, status.objects
    );
}

pub fn umount(mountpoint: &Path, timeout: u64) -> Result<ExitCode, Error> {
    let pid = nix::unistd::Pid::from_raw(read_status(mountpoint)?.pid as i32);
    let out = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(mountpoint)
        .output();
    let ok = match &out {
        Ok(o) if o.status.success() => true,
        _ if nix::unistd::geteuid().is_root() => std::process::Command::new("umount")
            .arg(mountpoint)
            .status()
            .map(|s| s.success())
            .unwrap_or(false),
        _ => false,
    };
    if !ok {
        let detail = out
            .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
            .unwrap_or_else(|e| e.to_string());
        return Err(Error::Busy(format!(
            "could not unmount {}: {detail}",
            mountpoint.display()
        )));
    }
    let deadline = Instant::now() + Duration::from_secs(timeout);
    while nix::sys::signal::kill(pid, None).is_ok() {
        if Instant::now() > deadline {
            return Err(Error::Busy(format!(
                "unmounted, but daemon pid {pid} is still finishing after {timeout}s"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(ExitCode::SUCCESS)
}

/// Keep each write(2) well under the kernel's FUSE write size so it arrives whole.
const LOAD_CHUNK: usize = 64 * 1024;

pub fn load(
    mountpoint: &Path,
    backend: &BackendName,
    file: Option<&Path>,
) -> Result<ExitCode, Error> {
    let input: Box<dyn BufRead> = match file {
        Some(p) => Box::new(BufReader::new(std::fs::File::open(p).ctx("open", p)?)),
        None => Box::new(BufReader::new(std::io::stdin())),
    };
    let mut batch: Vec<String> = Vec::new();
    let mut batch_bytes = 0;
    let mut loaded = 0usize;
    // Each batch is one atomic write; a refused batch stops the load, and we say how far
    // it got.
    let send = |batch: &mut Vec<String>, loaded: &mut usize| -> Result<(), Error> {
        match requests(mountpoint, batch) {
            Ok(answers) => {
                *loaded += answers.len();
                batch.clear();
                Ok(())
            }
            Err(e) => Err(Error::Invalid(format!(
                "{e} ({loaded} keys were loaded before this batch of {})",
                batch.len()
            ))),
        }
    };
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|e| Error::io("read input", e))?;
        if line.is_empty() {
            continue;
        }
        let (k, v) = line
            .split_once('\t')
            .ok_or_else(|| Error::Invalid(format!("line {}: expected KEY<TAB>VALUE", n + 1)))?;
        // Decode and re-encode: the daemon gets canonical fields (no raw spaces), so only
        // this line's number can be wrong, and it is reported here.
        let (k, v) = percent::decode(k)
            .and_then(|k| Ok((k, percent::decode(v)?)))
            .map_err(|e| {
                Error::Invalid(format!(
                    "line {}: {e} ({loaded} keys were loaded before it)",
                    n + 1
                ))
            })?;
        let command = format!(
            "put {backend} {} {}",
            percent::encode(&k),
            percent::encode(&v)
        );
        if batch_bytes + command.len() + 1 > LOAD_CHUNK && !batch.is_empty() {
            send(&mut batch, &mut loaded)?;
            batch_bytes = 0;
        }
        batch_bytes += command.len() + 1;
        batch.push(command);
    }
    if !batch.is_empty() {
        send(&mut batch, &mut loaded)?;
    }
    println!("loaded {loaded} keys into {backend}");
    Ok(ExitCode::SUCCESS)
}

/// A progress bar on stderr when it is a terminal; hidden otherwise.
pub fn progress_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() || total == 0 {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    bar.set_message(what.to_string());
    bar
}

/// A spinner on stderr when it is a terminal; hidden otherwise.
pub fn spinner(what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(what.to_string());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// Bytes referenced by a store's manifests (for fsck's progress bar); 0 if unreadable.
pub fn store_bytes(store: &Path) -> u64 {
    let Ok(repo) = ckptfs_core::repo::Repo::reader(&Location::from(store)) else {
        return 0;
    };
    let mut sizes = std::collections::BTreeMap::new();
    for m in repo.catalog.load_all().unwrap_or_default().values() {
        for b in &m.backends {
            for f in b.files.iter() {
                sizes.extend(f.stored());
            }
        }
    }
    sizes.values().sum()
}

/// The store behind a mountpoint (from its status), or the store `path` names.
fn resolve_store(path: &Path) -> Result<Location, Error> {
    match target(path)? {
        Target::Mount(mountpoint) => Location::parse(&read_status(&mountpoint)?.store),
        Target::Store(location) => Ok(location),
    }
}

pub fn graph(path: &Path, format: Option<&str>) -> Result<ExitCode, Error> {
    let store = resolve_store(path)?;
    let manifests = store_checkpoints(&store)?.1;
    let dot = ckptfs_core::commands::graph::dot(&manifests);
    let have_dot = std::process::Command::new("dot")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let svg =
        match format {
            Some("svg") if !have_dot => return Err(Error::NotFound(
                "Graphviz `dot` is not installed (apt-get install graphviz), or use --format dot"
                    .into(),
            )),
            Some("svg") => true,
            Some(_) => false,
            None => have_dot,
        };
    if !svg {
        print!("{dot}");
        return Ok(ExitCode::SUCCESS);
    }
    let mut child = std::process::Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .spawn()
        .map_err(|e| Error::io("run dot", e))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(dot.as_bytes())
        .map_err(|e| Error::io("write to dot", e))?;
    let status = child.wait().map_err(|e| Error::io("wait for dot", e))?;
    if !status.success() {
        return Err(Error::Invalid(format!("dot failed: {status}")));
    }
    Ok(ExitCode::SUCCESS)
}

/// Options of `-o` that mount(8) passes and that mean nothing to ckptfs.
const GENERIC_MOUNT_OPTIONS: &[&str] = &[
    "rw", "defaults", "auto", "noauto", "user", "users", "nouser", "_netdev", "nofail", "dev",
    "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime", "relatime",
];

/// Translate `mount.fuse.ckptfs STORE MOUNTPOINT [-o opt,opt=value,...]` (what mount(8)
/// runs for `mount -t fuse.ckptfs` and fstab lines) into `ckptfs mount ...` arguments.
/// Every long option of `mount` (`mount_command`) is an `-o` option, spelled with `_` or
/// `-`: `key=value` for one that takes a value, `key` for a flag; clap then checks the
/// values as it does on the command line. Generic options of mount(8) are ignored.
pub fn mount_helper_args(
    args: Vec<String>,
    mount_command: &clap::Command,
) -> Result<Vec<String>, String> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        if arg == "-o" {
            options.push(it.next().ok_or("-o needs an argument")?);
        } else if let Some(o) = arg.strip_prefix("-o") {
            options.push(o.to_string());
        } else if arg == "-n" || arg == "-s" || arg == "-f" || arg == "-v" {
            // mount(8) flags: no mtab, sloppy, fake, verbose.
        } else {
            positional.push(arg);
        }
    }
    let [store, mountpoint] = <[String; 2]>::try_from(positional)
        .map_err(|_| "usage: mount.fuse.ckptfs STORE MOUNTPOINT [-o options]".to_string())?;
    let mut out = vec!["ckptfs".to_string(), "mount".into(), store, mountpoint];
    for option in options
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| !o.is_empty())
    {
        let (key, value) = match option.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (option, None),
        };
        let long = key.replace('_', "-");
        let arg = mount_command
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && long != "help");
        match (arg, value) {
            (Some(arg), None) if !arg.get_action().takes_values() => {
                out.push(format!("--{long}"));
            }
            (Some(arg), Some(v)) if arg.get_action().takes_values() => {
                out.push(format!("--{long}"));
                out.push(v.to_string());
            }
            (Some(_), None) => {
                return Err(format!("mount option {key:?} needs a value ({key}=...)"))
            }
            (Some(_), Some(_)) => return Err(format!("mount option {key:?} takes no value")),
            (None, None) if GENERIC_MOUNT_OPTIONS.contains(&key) => {}
            (None, _) => return Err(format!("unknown mount option {option:?}")),
        }
    }
    Ok(out)
}

/// `ckptfs import`: through the daemon of a mountpoint, or into a store directly (taking
/// its lock or lease, as a daemon would: a store a daemon holds is refused, naming it).
pub fn import(
    target: &Path,
    imports: &[(BackendName, PathBuf)],
    state: Option<PathBuf>,
    wait: Duration,
    json: bool,
) -> Result<ExitCode, Error> {
    let answer = if target.join(".ckptfs/status").exists() {
        import_through_daemon(target, imports, wait)?
    } else {
        import_into_store(target, imports, state)?
    };
    if json {
        println!("{answer}");
    } else {
        println!("{}", answer["id"]);
    }
    Ok(ExitCode::SUCCESS)
}

fn import_through_daemon(
    mountpoint: &Path,
    imports: &[(BackendName, PathBuf)],
    wait: Duration,
) -> Result<serde_json::Value, Error> {
    use std::os::unix::ffi::OsStrExt;
    let mut lines = Vec::new();
    for (backend, dir) in imports {
        // The daemon runs elsewhere: it needs the whole path.
        let dir = std::fs::canonicalize(dir).ctx("import", dir)?;
        lines.push(format!(
            "import {backend} {}",
            percent::encode(dir.as_os_str().as_bytes())
        ));
    }
    lines.push("checkpoint".to_string());
    let spinner = spinner("import in progress");
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(20);
    let answer = loop {
        match requests(mountpoint, &lines) {
            Err(Error::Busy(_)) if Instant::now() + pause < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            other => break other,
        }
    };
    spinner.finish_and_clear();
    answer?
        .pop()
        .ok_or_else(|| Error::Corrupt("the daemon gave no answer".into()))
}

fn import_into_store(
    store: &Path,
    imports: &[(BackendName, PathBuf)],
    state: Option<PathBuf>,
) -> Result<serde_json::Value, Error> {
    // Every directory is checked before the store is touched.
    let scanned = imports
        .iter()
        .map(|(backend, dir)| ckptfs_core::import::scan(backend, dir))
        .collect::<Result<Vec<_>, Error>>()?;
    let engine = open_for_import(store, state)?;
    let spinner = spinner("import in progress");
    let done = engine
        .begin(ckptfs_core::CheckpointPlan::Import(scanned))
        .and_then(|pending| pending.complete_with_imports());
    spinner.finish_and_clear();
    let (manifest, reports) = done?;
    serde_json::from_str(&ckptfs::control::import_json(&manifest, &reports))
        .map_err(|e| Error::Corrupt(format!("unreadable answer: {e}")))
}

/// `ckptfs import-flink`: every completed checkpoint of the job under `src` newer than the
/// newest the store holds from it, oldest first, one checkpoint each; through the daemon
/// when `target` is a mountpoint.
pub fn import_flink(
    src: &Path,
    roots: &[PathBuf],
    target: &Path,
    state: Option<PathBuf>,
    json: bool,
) -> Result<ExitCode, Error> {
    use ckptfs_core::flink::import as flink;
    let answers: Vec<serde_json::Value> = if target.join(".ckptfs/status").exists() {
        use std::os::unix::ffi::OsStrExt;
        // The daemon runs elsewhere: it needs the whole path.
        let mut line = format!(
            "import-flink {}",
            percent::encode(flink::FlinkSource::absolute(src)?.as_os_str().as_bytes())
        );
        for root in roots {
            line.push(' ');
            line.push_str(&percent::encode(
                flink::FlinkSource::absolute(root)?.as_os_str().as_bytes(),
            ));
        }
        let spinner = spinner("import in progress");
        let answer = request(target, &line);
        spinner.finish_and_clear();
        match answer?["imported"].take() {
            serde_json::Value::Array(done) => done,
            other => return Err(Error::Corrupt(format!("unreadable answer: {other}"))),
        }
    } else {
        // Every checkpoint's metadata is read before the store is touched.
        let src = flink::FlinkSource::open(src, roots)?;
        flink::check_all(&flink::completed(&src)?)?;
        let engine = open_for_import(target, state)?;
        let mut done: Vec<serde_json::Value> = Vec::new();
        let mut flink_done = Vec::new();
        for imported in engine.import_flink(&src, false)? {
            match imported.result {
                Ok((manifest, reports)) => {
                    let line = ckptfs::control::import_json(&manifest, &reports);
                    done.push(serde_json::from_str(&line).expect("an answer is JSON"));
                    flink_done.push(imported.checkpoint);
                }
                Err(e) => {
                    // What was committed before the failure is said, then the failure.
                    print_flink_answers(&done, json);
                    let before = if done.is_empty() {
                        "nothing was imported".to_string()
                    } else {
                        format!(
                            "imported before it: Flink checkpoints {} as checkpoints {}",
                            join(&flink_done),
                            join(&done.iter().map(|a| a["id"].clone()).collect::<Vec<_>>())
                        )
                    };
                    if json {
                        let failed = serde_json::json!({
                            "ok": false,
                            "errno": e.errno(),
                            "error": e.to_string(),
                            "flink": {"job": imported.job, "checkpoint": imported.checkpoint},
                        });
                        println!("{failed}");
                    }
                    eprintln!(
                        "ckptfs: checkpoint {} of Flink job {} was not imported ({before})",
                        imported.checkpoint, imported.job
                    );
                    return Err(e);
                }
            }
        }
        done
    };
    print_flink_answers(&answers, json);
    Ok(ExitCode::SUCCESS)
}

/// The checkpoints `import-flink` committed: their ids, or with `json` their answers.
fn print_flink_answers(answers: &[serde_json::Value], json: bool) {
    for answer in answers {
        if json {
            println!("{answer}");
        } else {
            println!("{}", answer["id"]);
        }
    }
}

/// `a, b, c`.
fn join(items: &[impl std::fmt::Display]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `ckptfs export-flink`: from a mount, its `cp-N/` files and its label of N; from a store,
/// read directly.
pub fn export_flink(target: &Path, id: u64, dest: &Path, json: bool) -> Result<ExitCode, Error> {
    use ckptfs_core::flink::export;
    let exported = match self::target(target)? {
        Target::Mount(mountpoint) => {
            let row = read_checkpoints(&mountpoint)?
                .into_iter()
                .find(|row| row.id == id)
                .ok_or_else(|| {
                    Error::NotFound(format!("no checkpoint {id} in {}", mountpoint.display()))
                })?;
            let label = row.flink.ok_or_else(|| export::not_flink(id))?;
            let files = export::MountedCheckpoint(mountpoint.join(format!("cp-{id}")));
            export::export(&files, &label.job, label.checkpoint, dest)?
        }
        Target::Store(location) => {
            ckptfs_core::commands::export_flink::export_from_store(&location, id, dest)?
        }
    };
    if json {
        println!("{}", serde_json::to_string(&exported).expect("json"));
    } else {
        println!("{}", exported.path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The engine of a store written without a daemon: it hosts nothing and carries every
/// backend over. An existing directory that is no store is refused.
fn open_for_import(store: &Path, state: Option<PathBuf>) -> Result<ckptfs_core::Engine, Error> {
    let text = store
        .to_str()
        .ok_or_else(|| Error::Invalid(format!("{} is not valid UTF-8", store.display())))?;
    let location = Location::parse(text)?;
    if let Location::Local(dir) = &location {
        // An unmounted mountpoint is an existing directory that is no store: never turn it
        // into one by mistake.
        if dir.exists() && ckptfs_core::repo::check_is_store(dir).is_err() {
            return Err(Error::NotFound(format!(
                "{} is neither a ckptfs mount (not mounted?) nor a ckptfs store; to create a \
                 new store, give a path that does not exist yet",
                dir.display()
            )));
        }
    }
    let mut config = ckptfs_core::EngineConfig::new(location);
    config.state = state;
    config.host_backends = false;
    ckptfs_core::Engine::open(config)
}
