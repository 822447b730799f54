//! Runs the real `haltsql validate --format json` on one validation document.
//!
//! Each run gets a fresh private directory (mode 0700, the file inside 0600)
//! that is removed when the run ends, whatever the outcome: the guard that
//! owns it is dropped on every path, including timeouts and spawn failures.
//! The child runs with an empty environment, no stdin, the private directory
//! as its working directory and a relative file name, so the located errors
//! it prints name `policy.yaml`/`config.yaml` and never a random temp path
//! (which would make the condition message change on every run).
//!
//! Every run is sealed (`haltsql validate --sealed`): the document comes
//! from whoever may create a HaltSQLPolicy, so the child opens only that one
//! file (never through a symbolic link), resolves no placeholder and reads
//! no policy or catalog file the document names. Otherwise the report (which
//! carries each opened file's SHA-256) would tell the author about the
//! operator pod's files.
//!
//! Verdicts are cached by the SHA-256 of the document (file name and
//! contents): the same bytes always get the same answer from the same
//! binary, so a resync or a revert to earlier content costs no subprocess.
//! Only `Valid` and `Invalid` are cached; an `Error` says nothing about the
//! document and must be retried.
//!
//! At most `concurrency` runs go at once. Documents that arrive while every
//! run is busy wait, and the next free run takes all of them (up to
//! [`MAX_BATCH_DOCUMENTS`]) in one `haltsql validate`, each its own file in
//! one private directory: a cold start costs fewer processes than policies
//! (415 for 1,000 in the benchmark), while a single edit still runs at
//! once, alone. A batch
//! only ever decides `Valid`: a document with an error, and every document
//! of a batch that failed as a whole (timeout, signal, exit 2, a report
//! that cannot be believed), is judged again alone, so one bad document
//! never changes another's verdict, and every message names `policy.yaml`
//! exactly as a run of its own would. A hang costs the others at most one
//! timeout before they are judged alone.

use std::collections::{HashMap, VecDeque};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{Semaphore, oneshot};
use tracing::{debug, warn};

use crate::controllers::metrics::Metrics;
use crate::render::ValidationDocument;

/// Most stdout bytes read from one run. `haltsql validate` prints one JSON
/// report; even thousands of located errors stay far below this.
pub const MAX_STDOUT_BYTES: usize = 1024 * 1024;
/// Most stderr bytes kept from one run (only shown in error messages).
pub const MAX_STDERR_BYTES: usize = 16 * 1024;
/// Most bytes of a condition message built from located errors. The API
/// server allows 32 KiB; a few KiB is what a person reads in `kubectl describe`.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024;
/// Most located errors listed in a message.
pub const MAX_LISTED_ERRORS: usize = 20;
/// Verdicts kept in the cache; the oldest is evicted first.
pub const DEFAULT_CACHE_CAPACITY: usize = 1024;
/// Most documents judged by one `haltsql validate` run.
pub const MAX_BATCH_DOCUMENTS: usize = 64;
/// Most document bytes in one run (a policy is at most 256 KiB).
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// What `haltsql validate` said about a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Exit 0. `policy_name` is the `metadata.name` of the `kind: Policy`
    /// document, `None` for a Config (a bundle source names no policy).
    Valid { policy_name: Option<String> },
    /// Exit 1: the document was read and is wrong. The message lists the
    /// located errors, one per line, trimmed to [`MAX_MESSAGE_BYTES`].
    Invalid { message: String },
    /// The check could not run or its answer could not be trusted: spawn
    /// failure, timeout, signal, exit 2 or another code, unparseable or
    /// oversized output.
    Error { message: String },
}

impl Verdict {
    /// The `outcome` label of the metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            Verdict::Valid { .. } => "valid",
            Verdict::Invalid { .. } => "invalid",
            Verdict::Error { .. } => "error",
        }
    }
}

/// Runs `haltsql validate` and caches its verdicts.
pub struct Validator {
    binary: PathBuf,
    timeout: Duration,
    metrics: Metrics,
    temp_root: PathBuf,
    cache: Mutex<VerdictCache>,
    /// Documents waiting for a run, oldest first.
    waiting: Mutex<VecDeque<Waiting>>,
    /// One permit per run that may go at once.
    runs: Semaphore,
    /// Documents being judged, with whoever else waits for their verdict.
    in_flight: Mutex<HashMap<String, Vec<oneshot::Sender<Verdict>>>>,
}

/// The one judgement of a document under way. Landing hands its verdict to
/// everyone who asked meanwhile; dropped without landing (the asking pass
/// was cancelled), it lets them go with a cancelled verdict, which is
/// retried like any validator error.
struct Flight<'a> {
    in_flight: &'a Mutex<HashMap<String, Vec<oneshot::Sender<Verdict>>>>,
    /// `None` once landed.
    key: Option<String>,
}

impl Flight<'_> {
    fn land(mut self, verdict: &Verdict) {
        for follower in self.take_followers() {
            // A follower that went away needs no answer.
            let _ = follower.send(verdict.clone());
        }
    }

    fn take_followers(&mut self) -> Vec<oneshot::Sender<Verdict>> {
        match self.key.take() {
            Some(key) => lock(self.in_flight).remove(&key).unwrap_or_default(),
            None => Vec::new(),
        }
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        drop(self.take_followers());
    }
}

/// A document waiting for a run, and whoever waits for its verdict.
struct Waiting {
    key: String,
    doc: ValidationDocument,
    reply: oneshot::Sender<Verdict>,
}

impl Validator {
    /// A validator running `binary` with `timeout` per run and at most
    /// `concurrency` runs at once, creating its private directories under
    /// the system temp directory.
    pub fn new(binary: PathBuf, timeout: Duration, concurrency: usize, metrics: Metrics) -> Self {
        Self {
            binary,
            timeout,
            metrics,
            temp_root: std::env::temp_dir(),
            cache: Mutex::new(VerdictCache::new(DEFAULT_CACHE_CAPACITY)),
            waiting: Mutex::new(VecDeque::new()),
            runs: Semaphore::new(concurrency.max(1)),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// Creates the private directories under `root` instead (tests use this
    /// to check that every run cleans up).
    pub fn with_temp_root(mut self, root: PathBuf) -> Self {
        self.temp_root = root;
        self
    }

    /// The verdict for `doc`: from the cache when these exact bytes were
    /// judged before, otherwise from a `haltsql validate` run.
    pub async fn validate(&self, doc: &ValidationDocument) -> Verdict {
        let key = document_key(doc);
        if let Some(verdict) = self.cached(&key) {
            return verdict;
        }
        // The same document asked for twice at once (a policy's pass and the
        // start-up's judging ahead) is judged once.
        let flight = match self.join_flight(&key) {
            Ok(flight) => flight,
            Err(verdict) => return verdict.await.unwrap_or_else(|_| cancelled()),
        };
        // A run may have answered between the first look and the flight.
        let verdict = match self.cached(&key) {
            Some(verdict) => verdict,
            None => self.judge_queued(key, doc).await,
        };
        flight.land(&verdict);
        verdict
    }

    /// The flight of `key` if this caller is the first to ask for it, or
    /// where the first one's verdict will come.
    fn join_flight(&self, key: &str) -> Result<Flight<'_>, oneshot::Receiver<Verdict>> {
        let mut in_flight = lock(&self.in_flight);
        if let Some(followers) = in_flight.get_mut(key) {
            let (reply, verdict) = oneshot::channel();
            followers.push(reply);
            return Err(verdict);
        }
        in_flight.insert(key.to_owned(), Vec::new());
        Ok(Flight {
            in_flight: &self.in_flight,
            key: Some(key.to_owned()),
        })
    }

    fn cached(&self, key: &str) -> Option<Verdict> {
        let verdict = lock(&self.cache).get(key)?;
        self.metrics
            .validator_cache_hits
            .with_label_values(&[verdict.outcome()])
            .inc();
        Some(verdict)
    }

    /// Queues `doc` for the next run and takes part in the runs until its
    /// verdict comes.
    async fn judge_queued(&self, key: String, doc: &ValidationDocument) -> Verdict {
        let (reply, mut verdict) = oneshot::channel();
        lock(&self.waiting).push_back(Waiting {
            key,
            doc: doc.clone(),
            reply,
        });
        loop {
            tokio::select! {
                biased;
                answer = &mut verdict => return answer.unwrap_or_else(|_| cancelled()),
                permit = self.runs.acquire() => {
                    let Ok(_permit) = permit else {
                        return cancelled();
                    };
                    let batch = self.take_batch();
                    if batch.is_empty() {
                        // Another run took this document; its answer comes.
                        return verdict.await.unwrap_or_else(|_| cancelled());
                    }
                    self.judge_batch(batch).await;
                }
            }
        }
    }

    /// The oldest waiting documents, up to the batch limits; documents with
    /// the same key are judged once.
    fn take_batch(&self) -> Vec<Batched> {
        let mut waiting = lock(&self.waiting);
        let mut batch: Vec<Batched> = Vec::new();
        let mut bytes = 0;
        while let Some(next) = waiting.front() {
            if let Some(same) = batch.iter_mut().find(|b| b.key == next.key) {
                if let Some(w) = waiting.pop_front() {
                    same.replies.push(w.reply);
                }
                continue;
            }
            let size = next.doc.contents.len();
            if !batch.is_empty()
                && (batch.len() >= MAX_BATCH_DOCUMENTS || bytes + size > MAX_BATCH_BYTES)
            {
                break;
            }
            let Some(w) = waiting.pop_front() else { break };
            bytes += size;
            batch.push(Batched {
                key: w.key,
                doc: w.doc,
                replies: vec![w.reply],
            });
        }
        batch
    }

    /// Judges a batch and answers everyone waiting for it.
    async fn judge_batch(&self, batch: Vec<Batched>) {
        let verdicts: Vec<Option<Verdict>> = if batch.len() == 1 {
            vec![None]
        } else {
            let docs: Vec<&ValidationDocument> = batch.iter().map(|b| &b.doc).collect();
            self.run_together(&docs).await
        };
        for (entry, together) in batch.into_iter().zip(verdicts) {
            let verdict = match together {
                Some(verdict) => verdict,
                None => self.run_alone(&entry.doc).await,
            };
            if !matches!(verdict, Verdict::Error { .. }) {
                lock(&self.cache).insert(entry.key, verdict.clone());
            }
            self.metrics
                .validator_runs
                .with_label_values(&[verdict.outcome()])
                .inc();
            for reply in entry.replies {
                // The waiter may be gone (shutdown); nothing to tell it then.
                let _ = reply.send(verdict.clone());
            }
        }
    }

    /// One run of `doc` alone in a fresh private directory.
    async fn run_alone(&self, doc: &ValidationDocument) -> Verdict {
        let started = Instant::now();
        let verdict = self.run(doc).await;
        self.observe_run(verdict.outcome(), started);
        verdict
    }

    /// One run over several documents, each its own file of one private
    /// directory. Returns, per document, `Some(Valid)` when the run
    /// certainly found it valid and `None` when it must be judged alone.
    async fn run_together(&self, docs: &[&ValidationDocument]) -> Vec<Option<Verdict>> {
        let started = Instant::now();
        let names: Vec<String> = docs
            .iter()
            .enumerate()
            .map(|(i, doc)| format!("{i:03}-{}", doc.file_name))
            .collect();
        let undecided = || vec![None; docs.len()];
        if !docs.iter().all(|d| is_plain_file_name(&d.file_name)) {
            return undecided();
        }
        let Ok(dir) = PrivateDir::create(&self.temp_root) else {
            return undecided();
        };
        for (doc, name) in docs.iter().zip(&names) {
            if dir.write_file(name, doc.contents.as_bytes()).is_err() {
                return undecided();
            }
        }
        let run = self.spawn_and_collect(dir.path(), &names).await;
        drop(dir);
        let verdicts = match run {
            Ok((status, stdout, _)) if matches!(status.code(), Some(0 | 1)) => {
                match serde_json::from_slice::<Report>(&stdout) {
                    Ok(report) => names
                        .iter()
                        .map(|name| valid_in_batch(&report, name))
                        .collect(),
                    Err(_) => undecided(),
                }
            }
            _ => undecided(),
        };
        self.observe_run("batch", started);
        verdicts
    }

    fn observe_run(&self, outcome: &str, started: Instant) {
        self.metrics
            .validator_processes
            .with_label_values(&[outcome])
            .inc();
        self.metrics
            .validator_duration
            .with_label_values(&[outcome])
            .observe(started.elapsed().as_secs_f64());
    }

    /// One run in a fresh private directory, removed when `dir` drops.
    async fn run(&self, doc: &ValidationDocument) -> Verdict {
        if !is_plain_file_name(&doc.file_name) {
            return Verdict::Error {
                message: format!(
                    "refusing to validate a document named {:?}: not a plain file name",
                    doc.file_name
                ),
            };
        }
        let dir = match PrivateDir::create(&self.temp_root) {
            Ok(dir) => dir,
            Err(e) => {
                return Verdict::Error {
                    message: format!(
                        "cannot create a private directory under {}: {e}",
                        self.temp_root.display()
                    ),
                };
            }
        };
        if let Err(e) = dir.write_file(&doc.file_name, doc.contents.as_bytes()) {
            return Verdict::Error {
                message: format!("cannot write the document for haltsql validate: {e}"),
            };
        }
        let verdict = self.spawn_and_judge(dir.path(), &doc.file_name).await;
        drop(dir);
        verdict
    }

    async fn spawn_and_judge(&self, dir: &Path, file_name: &str) -> Verdict {
        match self.spawn_and_collect(dir, &[file_name.to_owned()]).await {
            Ok((status, stdout, stderr)) => judge(status, &stdout, &stderr),
            Err(verdict) => verdict,
        }
    }

    /// Runs `haltsql validate --sealed --format json -- FILES` in `dir` and
    /// collects its exit status, stdout and stderr; an `Err` is the verdict
    /// for a run that went wrong before its report could be read.
    async fn spawn_and_collect(
        &self,
        dir: &Path,
        file_names: &[String],
    ) -> Result<(std::process::ExitStatus, Vec<u8>, String), Verdict> {
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .args(["validate", "--sealed", "--format", "json", "--"])
            .args(file_names)
            .env_clear()
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Dropping the future (timeout, shutdown) must not leave a child behind.
            .kill_on_drop(true)
            // Its own process group, so that whatever it starts goes with it.
            .process_group(0);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                return Err(Verdict::Error {
                    message: format!("cannot run {}: {e}", self.binary.display()),
                });
            }
        };
        // Whatever the outcome, nothing of the run outlives it: a process the
        // validator started (and left holding its output, or running in the
        // background) is killed with the group when this guard drops.
        let group = ProcessGroup(
            child
                .id()
                .and_then(|id| rustix::process::Pid::from_raw(id.try_into().ok()?)),
        );
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let finished = tokio::time::timeout(self.timeout, async {
            tokio::join!(
                read_bounded(stdout, MAX_STDOUT_BYTES),
                read_bounded(stderr, MAX_STDERR_BYTES),
                child.wait()
            )
        })
        .await;
        let (stdout, stderr, status) = match finished {
            Ok(done) => done,
            Err(_) => {
                group.kill();
                if let Err(e) = child.start_kill() {
                    debug!(error = %e, "killing the timed-out validator");
                }
                // Reap it before the private directory goes away.
                let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                return Err(Verdict::Error {
                    message: format!(
                        "haltsql validate did not finish within {}s",
                        self.timeout.as_secs_f64()
                    ),
                });
            }
        };
        let status = match status {
            Ok(status) => status,
            Err(e) => {
                return Err(Verdict::Error {
                    message: format!("waiting for haltsql validate: {e}"),
                });
            }
        };
        let stderr = match stderr {
            Ok(out) => out.text(),
            Err(e) => format!("(stderr unreadable: {e})"),
        };
        let stdout = match stdout {
            Ok(out) if out.truncated => {
                return Err(Verdict::Error {
                    message: format!("haltsql validate printed more than {MAX_STDOUT_BYTES} bytes"),
                });
            }
            Ok(out) => out.bytes,
            Err(e) => {
                return Err(Verdict::Error {
                    message: format!("reading the output of haltsql validate: {e}"),
                });
            }
        };
        Ok((status, stdout, stderr))
    }
}

/// Documents of one batch with the same key, and everyone waiting for them.
struct Batched {
    key: String,
    doc: ValidationDocument,
    replies: Vec<oneshot::Sender<Verdict>>,
}

/// The verdict a batch run's report gives the file `name`: `Valid` only
/// when the report lists it as read and no error is located in it.
fn valid_in_batch(report: &Report, name: &str) -> Option<Verdict> {
    if report.errors.iter().any(|e| e.file == name) {
        return None;
    }
    let read: Vec<&ReportDocument> = report
        .documents
        .iter()
        .filter(|d| d.file.as_deref() == Some(name))
        .collect();
    let [document] = read.as_slice() else {
        return None;
    };
    Some(Verdict::Valid {
        policy_name: if document.kind.as_deref() == Some("Policy") {
            Some(document.name.clone()?)
        } else {
            None
        },
    })
}

fn cancelled() -> Verdict {
    Verdict::Error {
        message: "the validation was cancelled (the operator is stopping)".to_owned(),
    }
}

/// Prefix of every private directory (`haltsql-validate-<pid>-<random>`).
const PRIVATE_DIR_PREFIX: &str = "haltsql-validate-";

/// Removes the private directories an earlier run of the operator left in
/// `root` because it was killed in the middle of a validation: those whose
/// pid is no running process's, or this process's own (an earlier container
/// of the same pod, whose pids start over; this process has made none yet).
/// Call it once, before any validation. Returns how many it removed.
pub fn remove_stale_private_dirs(root: &Path) -> usize {
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PRIVATE_DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != own && Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        // A directory, not a symlink to one (file_type does not follow links).
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => removed += 1,
            Err(e) => {
                debug!(error = %e, dir = %entry.path().display(), "cannot remove a stale private directory")
            }
        }
    }
    removed
}

/// The process group of one validator run (its leader's pid), killed on drop.
struct ProcessGroup(Option<rustix::process::Pid>);

impl ProcessGroup {
    fn kill(&self) {
        if let Some(pid) = self.0 {
            // ESRCH: nothing left in the group, which is the usual case.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Turns an exit status and the JSON report into a verdict. Only a report
/// that parses and agrees with the exit code is believed.
fn judge(status: std::process::ExitStatus, stdout: &[u8], stderr: &str) -> Verdict {
    let code = match status.code() {
        Some(code) => code,
        None => {
            let signal = status
                .signal()
                .map_or_else(|| "unknown".to_owned(), |s| s.to_string());
            return Verdict::Error {
                message: format!("haltsql validate was killed by signal {signal}"),
            };
        }
    };
    let report = serde_json::from_slice::<Report>(stdout);
    match (code, report) {
        (0, Ok(report)) if report.valid && report.errors.is_empty() => Verdict::Valid {
            policy_name: report
                .documents
                .into_iter()
                .find(|d| d.kind.as_deref() == Some("Policy"))
                .and_then(|d| d.name),
        },
        (1, Ok(report)) if !report.valid && !report.errors.is_empty() => Verdict::Invalid {
            message: located_errors(&report.errors),
        },
        (0 | 1, Ok(_)) => Verdict::Error {
            message: format!(
                "haltsql validate exited with code {code} but its report disagrees{}",
                stderr_suffix(stderr)
            ),
        },
        (0 | 1, Err(e)) => Verdict::Error {
            message: format!(
                "haltsql validate exited with code {code} and unparseable output: {e}{}",
                stderr_suffix(stderr)
            ),
        },
        (2, Ok(report)) if !report.errors.is_empty() => Verdict::Error {
            message: format!(
                "haltsql validate could not check the document (exit code 2):\n{}",
                located_errors(&report.errors)
            ),
        },
        (code, _) => Verdict::Error {
            message: format!(
                "haltsql validate exited with code {code}{}",
                stderr_suffix(stderr)
            ),
        },
    }
}

fn stderr_suffix(stderr: &str) -> String {
    let stderr = stderr.trim();
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {}", truncate(stderr, 1024))
    }
}

/// `FILE:LINE:COLUMN: KEY.PATH: message` lines, as the CLI prints them in
/// text form, at most [`MAX_LISTED_ERRORS`] of them and [`MAX_MESSAGE_BYTES`].
fn located_errors(errors: &[LocatedError]) -> String {
    let mut message = String::new();
    let mut listed = 0;
    for e in errors.iter().take(MAX_LISTED_ERRORS) {
        let line = if e.path.is_empty() {
            format!("{}:{}:{}: {}", e.file, e.line, e.column, e.message)
        } else {
            format!(
                "{}:{}:{}: {}: {}",
                e.file, e.line, e.column, e.path, e.message
            )
        };
        let line = one_line(&line);
        // Keep room for the "more errors" note.
        if !message.is_empty() && message.len() + 1 + line.len() > MAX_MESSAGE_BYTES - 64 {
            break;
        }
        if !message.is_empty() {
            message.push('\n');
        }
        message.push_str(&truncate(&line, MAX_MESSAGE_BYTES - 64));
        listed += 1;
    }
    let rest = errors.len() - listed;
    if rest > 0 {
        message.push_str(&format!("\n(and {rest} more)"));
    }
    message
}

/// Control characters (a newline inside a message, for example) would break
/// the one-error-per-line form.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// At most `max` bytes of `s`, cut at a character boundary, marked with `...`.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// `haltsql validate --format json` output (see the haltsql contract).
#[derive(Deserialize)]
struct Report {
    valid: bool,
    #[serde(default)]
    documents: Vec<ReportDocument>,
    #[serde(default)]
    errors: Vec<LocatedError>,
}

#[derive(Deserialize)]
struct ReportDocument {
    #[serde(default)]
    file: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct LocatedError {
    #[serde(default)]
    file: String,
    #[serde(default)]
    line: u64,
    #[serde(default)]
    column: u64,
    #[serde(default)]
    path: String,
    #[serde(default)]
    message: String,
}

/// Output of one stream, cut at a limit.
struct Bounded {
    bytes: Vec<u8>,
    truncated: bool,
}

impl Bounded {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Reads at most `limit` bytes and discards the rest, so that a chatty child
/// never blocks on a full pipe and never fills our memory.
async fn read_bounded<R: AsyncRead + Unpin>(
    reader: Option<R>,
    limit: usize,
) -> std::io::Result<Bounded> {
    let Some(reader) = reader else {
        return Ok(Bounded {
            bytes: Vec::new(),
            truncated: false,
        });
    };
    let mut bytes = Vec::new();
    let mut limited = reader.take(limit as u64);
    limited.read_to_end(&mut bytes).await?;
    let mut reader = limited.into_inner();
    let extra = tokio::io::copy(&mut reader, &mut tokio::io::sink()).await?;
    Ok(Bounded {
        bytes,
        truncated: extra > 0,
    })
}

/// A document may only name a file inside its private directory.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.starts_with('-')
        && !name.contains(['/', '\\', '\0'])
}

/// The cache key: SHA-256 over the file name and the contents.
fn document_key(doc: &ValidationDocument) -> String {
    let mut hasher = Sha256::new();
    hasher.update(doc.file_name.as_bytes());
    hasher.update([0u8]);
    hasher.update(doc.contents.as_bytes());
    hex::encode(hasher.finalize())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the cache inconsistent
    // (every update is a single insert or remove), so keep using it.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Verdicts by document key, evicting the oldest entry when full.
struct VerdictCache {
    capacity: usize,
    entries: HashMap<String, Verdict>,
    order: VecDeque<String>,
}

impl VerdictCache {
    fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn get(&self, key: &str) -> Option<Verdict> {
        self.entries.get(key).cloned()
    }

    fn insert(&mut self, key: String, verdict: Verdict) {
        if self.entries.insert(key.clone(), verdict).is_some() {
            return;
        }
        self.order.push_back(key);
        while self.entries.len() > self.capacity {
            match self.order.pop_front() {
                Some(oldest) => {
                    self.entries.remove(&oldest);
                }
                None => break,
            }
        }
    }
}

/// A directory only this process's user can enter, removed on drop.
struct PrivateDir {
    /// `None` only while being dropped.
    dir: Option<tempfile::TempDir>,
}

impl PrivateDir {
    fn create(root: &Path) -> std::io::Result<Self> {
        // `<prefix><pid>-<random>`: the start-up sweep finds a killed
        // process's directories by the prefix and the pid. tempfile makes
        // the directory with mkdir, which never follows a symlink in the last
        // component and fails if the name exists (then it tries another), so
        // nobody can pre-plant it.
        let prefix = format!("{PRIVATE_DIR_PREFIX}{}-", std::process::id());
        let dir = tempfile::Builder::new()
            .prefix(&prefix)
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(root)?;
        // The umask can only remove bits; make the mode exact anyway.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
        Ok(Self { dir: Some(dir) })
    }

    fn path(&self) -> &Path {
        match &self.dir {
            Some(dir) => dir.path(),
            None => Path::new(""),
        }
    }

    fn write_file(&self, name: &str, contents: &[u8]) -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(self.path().join(name))?;
        // No fsync: the child reads it through the page cache, and the
        // directory is gone before a crash could matter.
        file.write_all(contents)
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        let path = dir.path().to_owned();
        if let Err(e) = dir.close()
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(path = %path.display(), error = %e, "cannot remove the validator's private directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn located_errors_are_one_per_line_and_bounded() {
        let errors: Vec<LocatedError> = (0..100)
            .map(|i| LocatedError {
                file: "policy.yaml".into(),
                line: i,
                column: 5,
                path: if i == 0 {
                    String::new()
                } else {
                    format!("tables.t{i}")
                },
                message: "unknown\nkey".into(),
            })
            .collect();
        let message = located_errors(&errors);
        assert!(message.len() <= MAX_MESSAGE_BYTES, "{}", message.len());
        let lines: Vec<&str> = message.lines().collect();
        assert_eq!(lines[0], "policy.yaml:0:5: unknown key");
        assert_eq!(lines[1], "policy.yaml:1:5: tables.t1: unknown key");
        assert_eq!(lines.len(), MAX_LISTED_ERRORS + 1);
        assert_eq!(lines[MAX_LISTED_ERRORS], "(and 80 more)");
    }

    #[test]
    fn huge_single_error_is_cut_at_a_char_boundary() {
        let errors = vec![LocatedError {
            file: "policy.yaml".into(),
            line: 1,
            column: 1,
            path: "x".into(),
            message: "é".repeat(10_000),
        }];
        let message = located_errors(&errors);
        assert!(message.len() <= MAX_MESSAGE_BYTES);
        assert!(message.ends_with("..."));
    }

    #[test]
    fn cache_evicts_the_oldest() {
        let mut cache = VerdictCache::new(2);
        let v = |n: &str| Verdict::Valid {
            policy_name: Some(n.into()),
        };
        cache.insert("a".into(), v("a"));
        cache.insert("b".into(), v("b"));
        cache.insert("a".into(), v("a"));
        cache.insert("c".into(), v("c"));
        assert_eq!(cache.get("a"), None);
        assert_eq!(cache.get("b"), Some(v("b")));
        assert_eq!(cache.get("c"), Some(v("c")));
    }

    #[test]
    fn file_names_stay_inside_the_directory() {
        assert!(is_plain_file_name("policy.yaml"));
        for bad in ["", ".", "..", "../x", "a/b", "-rf", "/etc/passwd"] {
            assert!(!is_plain_file_name(bad), "{bad}");
        }
    }
}
