//! The disk tier behind the prefix cache: KV state of long prompt prefixes
//! kept in files, so an agent's 10k-token prefix survives a restart, an
//! unload, a switch to another model and back, or eviction from RAM.
//!
//! Layout: `<root>/<fingerprint>/<key>.meta` beside its payload
//! `<key>-<writer>.kv`. The fingerprint folder holds one model's entries and
//! is named by a hash of everything that makes KV state valid (the model
//! file's identity, backend, KV type, context settings and this format's
//! version), so a changed setting never restores a foreign state. The key is
//! the last link of a hash chain over the prompt's 256-token blocks (and the
//! cache salt), so an entry is addressed by its tokens alone.
//!
//! The payload is the backend's own serialization of the sequence (llama.cpp's
//! sequence state file, MLX's arrays as f32). Where the backend can read its
//! payload's [`Layout`], the payload is cut into blocks of [`BLOCK_TOKENS`]
//! positions, each in a file `<link>.blk` named by its link of the hash
//! chain: prompts that share a prefix (two agents' system prompt and tools)
//! share its blocks on disk, and a hit reads only the blocks it needs, joined
//! back into a payload for the backend. Otherwise the payload is kept whole.
//! The meta holds the tokens, the layout's fixed parts (or the whole
//! payload's length and CRC-32), and a CRC of itself; each block file holds
//! its own CRC. An entry exists once its meta is renamed into place, after
//! its blocks or payload: a reader either sees a whole entry or none. A torn,
//! truncated, corrupted or older-format entry or block fails its checks, is
//! removed and is treated as a miss, so the request prefills cold. Writers
//! name their temporary files apart, so two servers sharing a data directory
//! never write the same file; a block another server removed while an entry
//! was being written is written again once that entry's meta is in place.
//!
//! Payloads are written on the engine thread (llama.cpp's state is reachable
//! only through its context), after the reply's final event has gone out;
//! the checksum, the renames, superseded entries and the budget are handled
//! by one background thread per process.
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::prefix_cache::{common_prefix, reusable};

pub mod layout;
use layout::Reader;
pub use layout::{Layout, LayoutFn, Piece};

/// Bumped whenever the meta or a payload layout changes: older entries then
/// fail their check and are removed.
pub const FORMAT_VERSION: u32 = 2;
/// Tokens per link of the key's hash chain.
pub const BLOCK_TOKENS: usize = 256;
/// Shortest prefix worth a file: below it a cold prefill takes about as long
/// as reading one back.
pub const DEFAULT_MIN_TOKENS: usize = 256;
/// A request that computes at least this many prompt tokens has its prompt
/// written as soon as its prefill ends, not only when its reply does: at
/// about 100 tokens/s on a laptop CPU that is 20 s of work a crash, a kill
/// or a client's timeout mid-reply would otherwise throw away.
pub const DEFAULT_SAVE_AFTER_PREFILL: usize = 2048;
/// How long writing stays paused after the disk ran full.
const FULL_PAUSE: Duration = Duration::from_secs(600);
/// Temporary files older than this are a dead writer's and are removed.
const STALE_TMP: Duration = Duration::from_secs(3600);
const META_MAGIC: &[u8; 8] = b"SHOALKVM";
const BLOCK_MAGIC: &[u8; 8] = b"SHOALKVB";
/// A block file's header: magic, format, positions, CRC-32 of the body.
const BLOCK_HEADER: usize = 20;

/// The disk tier's size unless told otherwise: 10 GiB, room for a few
/// agents' 16k-token prefixes of an 8B model (about 2 GiB each in f16) on a
/// laptop's disk.
pub const DEFAULT_DISK_MB: u64 = 10 * 1024;

/// The disk tier's bound: MiB, or off (`off`, or 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskBudget(pub Option<u64>);

impl Default for DiskBudget {
    fn default() -> Self {
        DiskBudget(Some(DEFAULT_DISK_MB))
    }
}

impl DiskBudget {
    /// The bound in bytes, or `None` when the tier is off.
    pub fn bytes(self) -> Option<u64> {
        self.0
            .filter(|&mb| mb > 0)
            .map(|mb| mb.saturating_mul(1 << 20))
    }
}

impl std::str::FromStr for DiskBudget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "none" | "false" | "0" => Ok(DiskBudget(None)),
            n => n
                .parse::<u64>()
                .map(|n| DiskBudget(Some(n)))
                .map_err(|_| format!("{s:?} is not a size in MiB or off")),
        }
    }
}

impl std::fmt::Display for DiskBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(n) if n > 0 => write!(f, "{n}"),
            _ => f.write_str("off"),
        }
    }
}

impl serde::Serialize for DiskBudget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(n) if n > 0 => s.serialize_u64(n),
            _ => s.serialize_str("off"),
        }
    }
}

impl<'de> serde::Deserialize<'de> for DiskBudget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(DiskBudget(Some(n))),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Settings of the disk tier.
#[derive(Clone, Debug)]
pub struct DiskCacheOptions {
    /// The folder that holds every model's entries.
    pub dir: PathBuf,
    /// Most bytes the entries may take; least recently used go first.
    pub budget_bytes: u64,
    /// Prefixes shorter than this are not written.
    pub min_tokens: usize,
    /// Prompt tokens a request must compute for its prompt to be written
    /// right after its prefill (see [`DEFAULT_SAVE_AFTER_PREFILL`]).
    pub save_after_prefill: usize,
}

/// Counters of the disk tier, for `/health` and `/metrics`.
#[derive(Default, Debug)]
pub struct DiskStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub hit_tokens: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub writes: AtomicU64,
    pub evictions: AtomicU64,
    /// Entries found torn, corrupted or of another format (and removed).
    pub bad_entries: AtomicU64,
    pub write_errors: AtomicU64,
    /// Blocks written, and blocks an entry found already on disk (a prefix
    /// another entry holds) and did not write again.
    pub blocks_written: AtomicU64,
    pub blocks_shared: AtomicU64,
}

/// What `/health`, `/v1/cache` and `shoal cache` show of the tier.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DiskSummary {
    pub dir: PathBuf,
    pub budget_bytes: u64,
    pub bytes: u64,
    pub entries: usize,
    /// Block files on disk (each held by one entry or shared by several).
    pub blocks: usize,
    pub writes_paused: bool,
    pub last_error: Option<String>,
    pub hits: u64,
    pub misses: u64,
    pub hit_tokens: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub writes: u64,
    pub evictions: u64,
    pub bad_entries: u64,
    pub write_errors: u64,
    pub blocks_written: u64,
    pub blocks_shared: u64,
}

/// One stored prefix, as listed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EntryInfo {
    pub model: String,
    pub backend: String,
    pub fingerprint: String,
    pub tokens: usize,
    /// Its files' size, blocks it shares with other entries included.
    pub bytes: u64,
    /// Its block files (0 for a payload kept whole).
    pub blocks: usize,
    /// Unix seconds of its last write or hit.
    pub last_used: u64,
    pub created: u64,
    /// Whether the entry is scoped to one API key (never shown which).
    pub scoped: bool,
}

/// An entry's meta, read back.
#[derive(Debug)]
pub struct Meta {
    pub fingerprint: [u8; 32],
    pub salt: u64,
    pub tokens: Vec<u32>,
    pub payload: String,
    pub payload_len: u64,
    pub payload_crc: u32,
    pub created: u64,
    /// Unix seconds until which the entry goes after unmarked ones (a
    /// client's cache breakpoint TTL); 0 for none.
    pub keep_until: u64,
    pub model: String,
    pub backend: String,
    /// The payload's layout ([`Layout::encode_pieces`]) when it is kept in
    /// blocks; empty when it is kept whole in `payload`.
    pub layout: Vec<u8>,
}

impl Meta {
    fn blocked(&self) -> bool {
        !self.layout.is_empty()
    }

    /// The file names of its blocks, in position order (none when whole).
    fn block_names(&self) -> Vec<String> {
        if !self.blocked() {
            return Vec::new();
        }
        chain_links(&Fingerprint(self.fingerprint), self.salt, &self.tokens)
            .iter()
            .map(block_name)
            .collect()
    }

    /// Its place in the eviction order: unmarked (or expired) entries by
    /// last use (nanoseconds) first, then marked ones by the end of their
    /// time (seconds).
    fn eviction_key(&self, used: u64, now: u64) -> (bool, u64) {
        if self.keep_until > now {
            (true, self.keep_until)
        } else {
            (false, used)
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(96 + self.tokens.len() * 4);
        b.extend_from_slice(META_MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&self.fingerprint);
        b.extend_from_slice(&self.salt.to_le_bytes());
        b.extend_from_slice(&self.payload_len.to_le_bytes());
        b.extend_from_slice(&self.payload_crc.to_le_bytes());
        b.extend_from_slice(&self.created.to_le_bytes());
        b.extend_from_slice(&self.keep_until.to_le_bytes());
        for s in [
            self.payload.as_bytes(),
            self.model.as_bytes(),
            self.backend.as_bytes(),
            &self.layout,
        ] {
            b.extend_from_slice(&(s.len() as u32).to_le_bytes());
            b.extend_from_slice(s);
        }
        b.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        for t in &self.tokens {
            b.extend_from_slice(&t.to_le_bytes());
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// The meta in `bytes`, or why it is not one of this format.
    fn decode(bytes: &[u8]) -> Result<Meta, String> {
        let (body, crc) = bytes
            .split_last_chunk::<4>()
            .ok_or_else(|| "truncated".to_string())?;
        if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
            return Err("checksum mismatch".into());
        }
        let mut r = Reader::new(body);
        if r.take(8)? != META_MAGIC {
            return Err("not a cache entry".into());
        }
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(format!(
                "format {version}, this build reads {FORMAT_VERSION}"
            ));
        }
        let mut fingerprint = [0u8; 32];
        fingerprint.copy_from_slice(r.take(32)?);
        let salt = r.u64()?;
        let payload_len = r.u64()?;
        let payload_crc = r.u32()?;
        let created = r.u64()?;
        let keep_until = r.u64()?;
        let payload = r.string()?;
        let model = r.string()?;
        let backend = r.string()?;
        let layout_len = r.u32()? as usize;
        let layout = r.take(layout_len)?.to_vec();
        let n = r.u32()? as usize;
        let raw = r.take(n.checked_mul(4).ok_or("token count overflows")?)?;
        let tokens = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if !r.rest().is_empty() {
            return Err("trailing bytes".into());
        }
        if payload.contains(['/', '\\']) || payload.starts_with('.') {
            return Err("payload name escapes its folder".into());
        }
        Ok(Meta {
            fingerprint,
            salt,
            tokens,
            payload,
            payload_len,
            payload_crc,
            created,
            keep_until,
            model,
            backend,
            layout,
        })
    }
}

/// What identifies valid KV state for a model: built from its file(s) and
/// every setting that changes what a position's keys and values are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// `model` (a GGUF file or a model directory) and the settings, named.
    /// A file is known by its size and the hash of its first and last MiB
    /// (its header and tensor table, and the end of its data), so a copy or a
    /// move of the same file keeps its entries and a changed file loses them.
    pub fn of(model: &Path, settings: &[(&str, String)]) -> std::io::Result<Fingerprint> {
        let mut h = Sha256::new();
        h.update(b"shoal-kv");
        h.update(FORMAT_VERSION.to_le_bytes());
        let mut files = Vec::new();
        if model.is_dir() {
            for e in std::fs::read_dir(model)? {
                let p = e?.path();
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                if name.ends_with(".safetensors") || name.ends_with(".json") {
                    files.push(p);
                }
            }
            files.sort();
        } else {
            files.push(model.to_path_buf());
        }
        for f in files {
            let mut file = std::fs::File::open(&f)?;
            let len = file.metadata()?.len();
            h.update(f.file_name().map(|n| n.as_encoded_bytes()).unwrap_or(b""));
            h.update(len.to_le_bytes());
            let mut buf = vec![0u8; (1 << 20).min(len as usize)];
            file.read_exact(&mut buf)?;
            h.update(&buf);
            if len > (2 << 20) {
                use std::io::Seek;
                file.seek(std::io::SeekFrom::End(-(1 << 20)))?;
                file.read_exact(&mut buf)?;
                h.update(&buf);
            }
        }
        for (k, v) in settings {
            h.update(k.as_bytes());
            h.update(b"=");
            h.update(v.as_bytes());
            h.update(b";");
        }
        Ok(Fingerprint(h.finalize().into()))
    }

    fn hex(&self) -> String {
        hex(&self.0[..16])
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The key of `tokens` under `fp` and `salt`: the last link of a hash chain
/// over its 256-token blocks (a partial last block included).
pub fn chain_key(fp: &Fingerprint, salt: u64, tokens: &[u32]) -> String {
    let seed = chain_seed(fp, salt);
    hex(&chain_links(fp, salt, tokens).last().unwrap_or(&seed)[..16])
}

fn chain_seed(fp: &Fingerprint, salt: u64) -> [u8; 32] {
    Sha256::new()
        .chain_update(fp.0)
        .chain_update(salt.to_le_bytes())
        .finalize()
        .into()
}

/// Each block's link of the hash chain: a block's link names its tokens and
/// every token before it, so equal links mean equal KV state.
fn chain_links(fp: &Fingerprint, salt: u64, tokens: &[u32]) -> Vec<[u8; 32]> {
    let mut link = chain_seed(fp, salt);
    tokens
        .chunks(BLOCK_TOKENS)
        .map(|block| {
            let mut h = Sha256::new();
            h.update(link);
            for t in block {
                h.update(t.to_le_bytes());
            }
            link = h.finalize().into();
            link
        })
        .collect()
}

fn block_name(link: &[u8; 32]) -> String {
    format!("{}.blk", hex(&link[..16]))
}

/// A block file's bytes: header, then `body` (the rows of `rows` positions).
fn block_bytes(rows: usize, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(BLOCK_HEADER + body.len());
    b.extend_from_slice(BLOCK_MAGIC);
    b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    b.extend_from_slice(&(rows as u32).to_le_bytes());
    b.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    b.extend_from_slice(body);
    b
}

/// The body of a block file that holds `rows` positions of `row_bytes`
/// each, or why it is not one.
fn block_body(file: &[u8], rows: usize, row_bytes: usize) -> Result<&[u8], String> {
    let mut r = Reader::new(file);
    if r.take(8)? != BLOCK_MAGIC {
        return Err("not a cache block".into());
    }
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Err(format!("block of format {version}"));
    }
    let (held, crc) = (r.u32()? as usize, r.u32()?);
    let body = r.rest();
    if held != rows || body.len() != rows * row_bytes {
        return Err("block of the wrong size".into());
    }
    if crc32fast::hash(body) != crc {
        return Err("block does not match its checksum".into());
    }
    Ok(body)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Creates `dir` (and its parents) readable by its owner only.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(dir)
}

/// A new file at `path` readable by its owner only.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    o.open(path)
}

/// A payload written by the engine thread, handed to the writer thread to
/// be checksummed and put in place.
struct WriteJob {
    dir: PathBuf,
    key: String,
    tmp: PathBuf,
    payload: String,
    meta: Meta,
    /// The backend's layout reader, to keep the payload in blocks.
    layout: Option<LayoutFn>,
}

/// The parsed metas of one fingerprint folder, refreshed from its listing so
/// another server's entries are seen too.
#[derive(Default)]
struct Index {
    metas: HashMap<PathBuf, Arc<Meta>>,
}

/// The disk tier of one process, shared by every model's engine.
pub struct DiskCache {
    opts: DiskCacheOptions,
    writer: Mutex<Option<SyncSender<WriteJob>>>,
    /// Writes queued or under way, and a signal when it drops.
    pending: Arc<(Mutex<usize>, Condvar)>,
    pub stats: Arc<DiskStats>,
    state: Arc<Mutex<TierState>>,
    indexes: Mutex<HashMap<PathBuf, Index>>,
    writer_id: String,
    counter: AtomicU64,
}

#[derive(Default)]
struct TierState {
    paused_until: Option<Instant>,
    last_error: Option<String>,
}

impl DiskCache {
    /// Opens (creating) the folder and starts the writer thread; stale
    /// temporary files of a writer that died are removed.
    pub fn open(opts: DiskCacheOptions) -> std::io::Result<Arc<DiskCache>> {
        private_dir(&opts.dir)?;
        let (tx, rx) = sync_channel::<WriteJob>(16);
        let stats = Arc::new(DiskStats::default());
        let pending = Arc::new((Mutex::new(0usize), Condvar::new()));
        let state = Arc::new(Mutex::new(TierState::default()));
        let cache = Arc::new(DiskCache {
            writer: Mutex::new(Some(tx)),
            pending: pending.clone(),
            stats: stats.clone(),
            state: state.clone(),
            indexes: Mutex::new(HashMap::new()),
            writer_id: writer_id(),
            counter: AtomicU64::new(0),
            opts: opts.clone(),
        });
        remove_stale_tmp(&opts.dir);
        std::thread::Builder::new()
            .name("shoal-kv-writer".into())
            .spawn(move || {
                for job in rx {
                    let dir = job.dir.clone();
                    let tmp = job.tmp.clone();
                    match place(job, &opts, &stats) {
                        Ok(()) => {}
                        Err(e) => {
                            let _ = std::fs::remove_file(&tmp);
                            stats.write_errors.fetch_add(1, Ordering::Relaxed);
                            let full = e.raw_os_error() == Some(28);
                            tracing::warn!(dir = %dir.display(), error = %e, full,
                                "could not write a prefix to the disk cache");
                            let mut s = lock(&state);
                            s.last_error = Some(e.to_string());
                            if full {
                                s.paused_until = Some(Instant::now() + FULL_PAUSE);
                            }
                        }
                    }
                    let (n, cv) = &*pending;
                    let mut n = lock(n);
                    *n = n.saturating_sub(1);
                    cv.notify_all();
                }
            })?;
        Ok(cache)
    }

    pub fn options(&self) -> &DiskCacheOptions {
        &self.opts
    }

    /// The tier for one model.
    pub fn for_model(
        self: &Arc<Self>,
        fp: Fingerprint,
        model: &str,
        backend: &str,
    ) -> std::io::Result<ModelDisk> {
        let dir = self.opts.dir.join(fp.hex());
        private_dir(&dir)?;
        Ok(ModelDisk {
            cache: self.clone(),
            fp,
            dir,
            model: model.to_string(),
            backend: backend.to_string(),
            align: 1,
            layout: None,
        })
    }

    /// Waits up to `limit` for queued writes to land (a server's shutdown,
    /// a test); false if some were still under way.
    pub fn wait_idle(&self, limit: Duration) -> bool {
        let (n, cv) = &*self.pending;
        let deadline = Instant::now() + limit;
        let mut n = lock(n);
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            n = cv
                .wait_timeout(n, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        true
    }

    fn writes_paused(&self) -> bool {
        let mut s = lock(&self.state);
        match s.paused_until {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                s.paused_until = None;
                false
            }
            None => false,
        }
    }

    /// Every entry on disk (every model's), newest use first.
    pub fn entries(&self) -> Vec<EntryInfo> {
        let mut out: Vec<EntryInfo> = all_metas(&self.opts.dir)
            .into_iter()
            .map(|(path, meta, used)| {
                let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
                let files = entry_files(&path, &meta);
                let bytes = files.iter().map(|p| size(p)).sum();
                EntryInfo {
                    model: meta.model.clone(),
                    backend: meta.backend.clone(),
                    fingerprint: hex(&meta.fingerprint[..16]),
                    tokens: meta.tokens.len(),
                    bytes,
                    // The meta, then its payload or its blocks.
                    blocks: if meta.blocked() { files.len() - 1 } else { 0 },
                    last_used: used / 1_000_000_000,
                    created: meta.created,
                    scoped: meta.salt != 0,
                }
            })
            .collect();
        out.sort_by_key(|e| std::cmp::Reverse(e.last_used));
        out
    }

    /// Removes every entry, or those of `model` (by the name it was served
    /// under); how many went.
    pub fn clear(&self, model: Option<&str>) -> usize {
        let mut n = 0;
        let mut folders = std::collections::HashSet::new();
        for (path, meta, _) in all_metas(&self.opts.dir) {
            if model.is_some_and(|m| m != meta.model) {
                continue;
            }
            remove_entry(&path, &meta);
            if let Some(d) = path.parent() {
                folders.insert(d.to_path_buf());
            }
            n += 1;
        }
        for d in folders {
            sweep_blocks(&d, None);
        }
        lock(&self.indexes).clear();
        n
    }

    /// The tier's figures; sizes from the folder's listing alone (no file
    /// is read), so `/health` and `/metrics` can ask often.
    pub fn summary(&self) -> DiskSummary {
        let (mut bytes, mut entries, mut blocks) = (0u64, 0usize, 0usize);
        for d in std::fs::read_dir(&self.opts.dir)
            .into_iter()
            .flatten()
            .flatten()
        {
            for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
                let p = f.path();
                match p.extension().and_then(|x| x.to_str()) {
                    Some("meta") => entries += 1,
                    Some("blk") => blocks += 1,
                    Some("kv") => {}
                    _ => continue,
                }
                bytes += f.metadata().map_or(0, |m| m.len());
            }
        }
        let s = lock(&self.state);
        let st = &self.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DiskSummary {
            dir: self.opts.dir.clone(),
            budget_bytes: self.opts.budget_bytes,
            bytes,
            entries,
            blocks,
            writes_paused: s.paused_until.is_some_and(|t| Instant::now() < t),
            last_error: s.last_error.clone(),
            hits: get(&st.hits),
            misses: get(&st.misses),
            hit_tokens: get(&st.hit_tokens),
            bytes_read: get(&st.bytes_read),
            bytes_written: get(&st.bytes_written),
            writes: get(&st.writes),
            evictions: get(&st.evictions),
            bad_entries: get(&st.bad_entries),
            write_errors: get(&st.write_errors),
            blocks_written: get(&st.blocks_written),
            blocks_shared: get(&st.blocks_shared),
        }
    }

    /// The metas of `dir`, the index refreshed from its listing (new files
    /// parsed, vanished ones dropped, bad ones removed).
    fn metas(&self, dir: &Path) -> Vec<(PathBuf, Arc<Meta>)> {
        let mut indexes = lock(&self.indexes);
        let index = indexes.entry(dir.to_path_buf()).or_default();
        let Ok(listing) = std::fs::read_dir(dir) else {
            index.metas.clear();
            return Vec::new();
        };
        let mut seen = std::collections::HashSet::new();
        for e in listing.flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("meta") {
                continue;
            }
            seen.insert(p.clone());
            if index.metas.contains_key(&p) {
                continue;
            }
            match std::fs::read(&p)
                .map_err(|e| e.to_string())
                .and_then(|b| Meta::decode(&b))
            {
                Ok(m) => {
                    index.metas.insert(p, Arc::new(m));
                }
                Err(why) => {
                    // Gone meanwhile (another server evicted it) is no fault.
                    if p.exists() {
                        tracing::warn!(file = %p.display(), why, "removing a bad disk cache entry");
                        self.stats.bad_entries.fetch_add(1, Ordering::Relaxed);
                        let _ = std::fs::remove_file(&p);
                    }
                }
            }
        }
        index.metas.retain(|p, _| seen.contains(p));
        index
            .metas
            .iter()
            .map(|(p, m)| (p.clone(), m.clone()))
            .collect()
    }

    fn forget(&self, dir: &Path, meta_path: &Path) {
        if let Some(i) = lock(&self.indexes).get_mut(dir) {
            i.metas.remove(meta_path);
        }
    }
}

/// A name no other writer of the folder uses: this process, when it
/// started writing, and which of its tiers (two tiers of one process, as
/// two engines in one test, must not share temporary file names either).
fn writer_id() -> String {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let n = OPENED.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:x}{:x}{n:x}",
        std::process::id(),
        now_secs() & 0xffff_ffff
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes an entry's meta and its payload kept whole; its blocks stay for
/// [`sweep_blocks`], since other entries may share them.
fn remove_entry(meta_path: &Path, meta: &Meta) {
    let _ = std::fs::remove_file(meta_path);
    if !meta.payload.is_empty() {
        let _ = std::fs::remove_file(meta_path.with_file_name(&meta.payload));
    }
}

/// The files an entry reads: its meta, and its payload or its blocks.
fn entry_files(meta_path: &Path, meta: &Meta) -> Vec<PathBuf> {
    let mut files = vec![meta_path.to_path_buf()];
    if meta.blocked() {
        files.extend(
            meta.block_names()
                .iter()
                .map(|b| meta_path.with_file_name(b)),
        );
    } else {
        files.push(meta_path.with_file_name(&meta.payload));
    }
    files
}

/// Every block file name the entries of `dir` hold.
fn held_blocks(dir: &Path) -> std::collections::HashSet<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|f| f.path())
        .filter(|p| p.extension().and_then(|x| x.to_str()) == Some("meta"))
        .filter_map(|p| Meta::decode(&std::fs::read(p).ok()?).ok())
        .flat_map(|m| m.block_names())
        .collect()
}

/// Removes the blocks of `dir` that no entry holds: among `among` (the
/// blocks of entries just removed), or all of them.
fn sweep_blocks(dir: &Path, among: Option<&std::collections::HashSet<String>>) {
    let held = held_blocks(dir);
    for f in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = f.file_name().to_string_lossy().into_owned();
        if name.ends_with(".blk")
            && !held.contains(&name)
            && among.is_none_or(|a| a.contains(&name))
        {
            let _ = std::fs::remove_file(f.path());
        }
    }
}

/// Every readable meta under `root` with its last use (the meta's mtime, in
/// nanoseconds: entries written within one second still keep their order).
fn all_metas(root: &Path) -> Vec<(PathBuf, Meta, u64)> {
    let mut out = Vec::new();
    let Ok(dirs) = std::fs::read_dir(root) else {
        return out;
    };
    for d in dirs.flatten() {
        let Ok(files) = std::fs::read_dir(d.path()) else {
            continue;
        };
        for f in files.flatten() {
            let p = f.path();
            if p.extension().and_then(|x| x.to_str()) != Some("meta") {
                continue;
            }
            let Ok(bytes) = std::fs::read(&p) else {
                continue;
            };
            let Ok(meta) = Meta::decode(&bytes) else {
                continue;
            };
            let used = f
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            out.push((p, meta, used));
        }
    }
    out
}

/// Removes temporary files that a dead writer left (another live server's
/// are younger than [`STALE_TMP`]), and payloads no meta names.
fn remove_stale_tmp(root: &Path) {
    let Ok(dirs) = std::fs::read_dir(root) else {
        return;
    };
    for d in dirs.flatten() {
        let Ok(files) = std::fs::read_dir(d.path()) else {
            continue;
        };
        let files: Vec<_> = files.flatten().map(|f| f.path()).collect();
        let named: std::collections::HashSet<String> = files
            .iter()
            .filter(|p| p.extension().and_then(|x| x.to_str()) == Some("meta"))
            .filter_map(|p| std::fs::read(p).ok())
            .filter_map(|b| Meta::decode(&b).ok())
            .flat_map(|m| {
                let mut names = m.block_names();
                names.push(m.payload);
                names
            })
            .collect();
        for p in files {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let old = std::fs::metadata(&p)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_TMP);
            let orphan = (name.ends_with(".kv") || name.ends_with(".blk")) && !named.contains(name);
            if old && (name.contains(".tmp") || orphan) {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
}

/// The length and CRC-32 of the file at `path`, read in 1 MiB pieces.
fn file_crc(path: &Path) -> std::io::Result<(u64, u32)> {
    let mut f = std::fs::File::open(path)?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
    Ok((len, hasher.finalize()))
}

/// Writes those of the blocks `which` (indexes into `names`) that are not
/// on disk yet (a block already there, written for another entry that
/// shares the prefix, is kept and touched), each cut from the payload only
/// when written, so a large payload is never copied whole. Returns the
/// bytes written; on an error the blocks this call wrote are removed.
fn write_blocks(
    dir: &Path,
    names: &[String],
    which: impl Iterator<Item = usize>,
    cut: &layout::Cutter<'_>,
    rows: usize,
    tag: &str,
    stats: &DiskStats,
) -> std::io::Result<u64> {
    let mut written: Vec<PathBuf> = Vec::new();
    let mut bytes = 0;
    for i in which {
        let Some(name) = names.get(i) else { continue };
        let path = dir.join(name);
        let first = i * BLOCK_TOKENS;
        let n = rows.saturating_sub(first).min(BLOCK_TOKENS);
        let size = (BLOCK_HEADER + n * cut.row_bytes()) as u64;
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == size) {
            if let Ok(f) = std::fs::File::options().write(true).open(&path) {
                let _ = f.set_modified(SystemTime::now());
            }
            stats.blocks_shared.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let file = block_bytes(n, &cut.block(first, first + n));
        let tmp = dir.join(format!("{name}.tmp-{tag}"));
        let put = private_file(&tmp)
            .and_then(|mut f| f.write_all(&file))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = put {
            let _ = std::fs::remove_file(&tmp);
            for p in written {
                let _ = std::fs::remove_file(p);
            }
            return Err(e);
        }
        written.push(path);
        bytes += size;
        stats.blocks_written.fetch_add(1, Ordering::Relaxed);
    }
    Ok(bytes)
}

/// The writer thread's part: checksum the payload (or cut it into blocks),
/// put it and its meta in place, drop entries it supersedes, keep the
/// budget.
fn place(job: WriteJob, opts: &DiskCacheOptions, stats: &DiskStats) -> std::io::Result<()> {
    let WriteJob {
        dir,
        key,
        tmp,
        payload,
        mut meta,
        layout,
    } = job;
    let rows = meta.tokens.len();
    // With a layout reader the payload stays in memory while its blocks are
    // cut from it; one the reader does not read to the byte (or that holds
    // other than `rows` positions) is kept whole.
    let bytes = match layout {
        Some(_) => Some(std::fs::read(&tmp)?),
        None => None,
    };
    let parsed = layout
        .zip(bytes.as_deref())
        .and_then(|(parse, b)| parse(b))
        .filter(|l| l.rows == rows);
    let cut = parsed
        .as_ref()
        .zip(bytes.as_deref())
        .and_then(|(l, b)| l.cutter(b));
    let (len, crc) = match &bytes {
        Some(b) => (b.len() as u64, crc32fast::hash(b)),
        None => file_crc(&tmp)?,
    };
    if len + 4096 > opts.budget_bytes {
        std::fs::remove_file(&tmp)?;
        return Ok(());
    }
    let names = match (&parsed, &cut) {
        (Some(l), Some(cut)) => {
            std::fs::remove_file(&tmp)?;
            meta.payload = String::new();
            meta.payload_len = len;
            meta.payload_crc = 0;
            meta.layout = l.encode_pieces();
            let names = meta.block_names();
            let written = write_blocks(&dir, &names, 0..names.len(), cut, rows, &payload, stats)?;
            Some((names, written))
        }
        _ => {
            meta.payload_len = len;
            meta.payload_crc = crc;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
            }
            std::fs::rename(&tmp, dir.join(&meta.payload))?;
            None
        }
    };
    let meta_path = dir.join(format!("{key}.meta"));
    // Entries whose tokens this one extends add nothing: they go once it is
    // in place, and a time a client marked one of them with carries over.
    let superseded: Vec<(PathBuf, Meta)> = std::fs::read_dir(&dir)?
        .flatten()
        .map(|f| f.path())
        .filter(|p| *p != meta_path && p.extension().and_then(|x| x.to_str()) == Some("meta"))
        .filter_map(|p| {
            let m = Meta::decode(&std::fs::read(&p).ok()?).ok()?;
            let extends = m.salt == meta.salt
                && m.tokens.len() < meta.tokens.len()
                && meta.tokens.starts_with(&m.tokens);
            extends.then_some((p, m))
        })
        .collect();
    meta.keep_until = superseded
        .iter()
        .map(|(_, m)| m.keep_until)
        .fold(meta.keep_until, u64::max);
    let meta_tmp = dir.join(format!("{key}.meta.tmp-{payload}"));
    let bytes = meta.encode();
    {
        let mut m = private_file(&meta_tmp)?;
        m.write_all(&bytes)?;
    }
    // An entry this one replaces (the same key, from another writer) leaves
    // its whole payload behind: remove it once the new meta is in place.
    let replaced = std::fs::read(&meta_path)
        .ok()
        .and_then(|b| Meta::decode(&b).ok())
        .map(|m| m.payload)
        .filter(|p| !p.is_empty() && *p != meta.payload);
    std::fs::rename(&meta_tmp, &meta_path)?;
    if let Some(old) = replaced {
        let _ = std::fs::remove_file(dir.join(old));
    }
    let mut written = len;
    if let (Some((names, block_bytes)), Some(cut)) = (names, &cut) {
        // A block found on disk may have been swept by another server (or a
        // clear) before this meta held it: write it again now that it does.
        let gone = (0..names.len()).filter(|&i| !dir.join(&names[i]).exists());
        let again = write_blocks(&dir, &names, gone, cut, rows, &payload, stats).unwrap_or(0);
        written = block_bytes + again;
    }
    stats.writes.fetch_add(1, Ordering::Relaxed);
    stats
        .bytes_written
        .fetch_add(written + bytes.len() as u64, Ordering::Relaxed);
    let mut dropped = std::collections::HashSet::new();
    for (p, m) in superseded {
        remove_entry(&p, &m);
        dropped.extend(m.block_names());
    }
    if !dropped.is_empty() {
        sweep_blocks(&dir, Some(&dropped));
    }
    enforce_budget(&opts.dir, opts.budget_bytes, stats);
    Ok(())
}

/// Removes least recently used entries (every model's) until the tier fits;
/// a block goes with the last entry that holds it.
fn enforce_budget(root: &Path, budget: u64, stats: &DiskStats) {
    let mut sizes: HashMap<PathBuf, u64> = HashMap::new();
    for d in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            let p = f.path();
            if matches!(
                p.extension().and_then(|x| x.to_str()),
                Some("meta" | "kv" | "blk")
            ) {
                sizes.insert(p, f.metadata().map_or(0, |m| m.len()));
            }
        }
    }
    let mut total: u64 = sizes.values().sum();
    if total <= budget {
        return;
    }
    let mut entries = all_metas(root);
    let mut holders: HashMap<PathBuf, usize> = HashMap::new();
    for (p, m, _) in &entries {
        for b in m.block_names() {
            *holders.entry(p.with_file_name(b)).or_default() += 1;
        }
    }
    let now = now_secs();
    entries.sort_by_key(|e| e.1.eviction_key(e.2, now));
    for (p, m, _) in entries {
        if total <= budget {
            break;
        }
        remove_entry(&p, &m);
        let mut freed = sizes.get(&p).copied().unwrap_or(0);
        if !m.blocked() {
            freed += sizes
                .get(&p.with_file_name(&m.payload))
                .copied()
                .unwrap_or(0);
        }
        for b in m.block_names() {
            let path = p.with_file_name(b);
            if let Some(n) = holders.get_mut(&path) {
                *n = n.saturating_sub(1);
                if *n == 0 && std::fs::remove_file(&path).is_ok() {
                    freed += sizes.get(&path).copied().unwrap_or(0);
                }
            }
        }
        total = total.saturating_sub(freed);
        stats.evictions.fetch_add(1, Ordering::Relaxed);
    }
}

/// A disk hit: the entry to restore and how many leading prompt tokens it
/// holds.
pub struct DiskHit {
    /// Tokens the entry holds (the payload's whole length).
    pub stored: usize,
    /// Leading prompt tokens it shares (what the request reuses).
    pub tokens: usize,
    meta_path: PathBuf,
    meta: Arc<Meta>,
}

/// A hit made ready for the backend: the bytes of a payload of the
/// backend's own format holding `tokens` (at least the hit's; a hit read
/// from blocks holds its last block whole).
pub struct Restorable {
    pub payload: Vec<u8>,
    pub tokens: Vec<u32>,
    /// Bytes read from the tier for it.
    bytes: u64,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache")
            .field("dir", &self.opts.dir)
            .field("budget_bytes", &self.opts.budget_bytes)
            .finish()
    }
}

/// One model's view of the disk tier.
pub struct ModelDisk {
    cache: Arc<DiskCache>,
    fp: Fingerprint,
    dir: PathBuf,
    model: String,
    backend: String,
    /// A hit is a multiple of this many tokens (see [`reusable`]).
    align: usize,
    /// The backend's reader of its payload's layout, to keep it in blocks.
    layout: Option<LayoutFn>,
}

impl ModelDisk {
    /// Hits cut to a multiple of `unit` tokens (see [`reusable`]).
    pub fn aligned(mut self, unit: usize) -> Self {
        self.align = unit.max(1);
        self
    }

    /// Payloads kept in blocks, cut by the backend's layout reader (those it
    /// does not read are kept whole).
    pub fn with_layout(mut self, layout: Option<LayoutFn>) -> Self {
        self.layout = layout;
        self
    }

    /// The stored entry sharing the longest prefix with `prompt` under
    /// `salt`, if it beats `better_than` tokens by at least one block (a
    /// shorter gain is not worth a file's read). Leaves one prompt token to
    /// compute, as the RAM tier does.
    pub fn lookup(&self, prompt: &[u32], salt: u64, better_than: usize) -> Option<DiskHit> {
        if prompt.len() < 2 {
            return None;
        }
        let limit = prompt.len() - 1;
        let best = self
            .cache
            .metas(&self.dir)
            .into_iter()
            .filter(|(_, m)| m.salt == salt && m.fingerprint == self.fp.0)
            .map(|(p, m)| {
                let n = reusable(common_prefix(&m.tokens, prompt), prompt.len(), self.align);
                (p, m, n)
            })
            .max_by_key(|e| e.2);
        match best {
            Some((meta_path, meta, n)) if n >= better_than + BLOCK_TOKENS.min(limit) && n > 0 => {
                Some(DiskHit {
                    stored: meta.tokens.len(),
                    tokens: n,
                    meta_path,
                    meta,
                })
            }
            _ => {
                self.cache.stats.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// A hit's payload, checked against its meta (length and CRC) or joined
    /// from the blocks it needs, each checked against its own CRC. A bad
    /// entry (or block) is removed and counted, and the caller prefills
    /// cold.
    pub fn open(&self, hit: &DiskHit) -> Option<Restorable> {
        if !hit.meta.blocked() {
            let payload = self.verify(hit)?;
            return Some(Restorable {
                bytes: payload.len() as u64,
                payload,
                tokens: hit.meta.tokens.clone(),
            });
        }
        match self.join(hit) {
            Ok(r) => Some(r),
            Err((why, block)) => {
                if let Some(b) = block {
                    tracing::warn!(file = %b.display(), why, "removing a bad disk cache block");
                    let _ = std::fs::remove_file(b);
                }
                if hit.meta_path.exists() {
                    self.bad(hit, &why);
                } else {
                    // Evicted by another server between listing and reading.
                    self.cache.forget(&self.dir, &hit.meta_path);
                }
                self.cache.stats.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// The blocks a hit needs, joined into the backend's payload, or why not
    /// (and the block at fault, if one is).
    fn join(&self, hit: &DiskHit) -> std::result::Result<Restorable, (String, Option<PathBuf>)> {
        let layout = Layout::decode_pieces(&hit.meta.layout).map_err(|e| (e, None))?;
        let row_bytes = layout.row_bytes();
        let names = hit.meta.block_names();
        let stored = hit.meta.tokens.len();
        let need = hit.tokens.div_ceil(BLOCK_TOKENS).min(names.len());
        let mut files = Vec::with_capacity(need);
        for name in &names[..need] {
            let path = self.dir.join(name);
            match std::fs::read(&path) {
                Ok(b) => files.push((path, b)),
                Err(e) => return Err((format!("block {name}: {e}"), None)),
            }
        }
        let mut parts = Vec::with_capacity(need);
        for (i, (path, file)) in files.iter().enumerate() {
            let rows = (stored - i * BLOCK_TOKENS).min(BLOCK_TOKENS);
            let body =
                block_body(file, rows, row_bytes).map_err(|why| (why, Some(path.clone())))?;
            parts.push((rows, body));
        }
        let held: usize = parts.iter().map(|p| p.0).sum();
        let payload = layout
            .join(&parts)
            .ok_or_else(|| ("blocks do not fit the entry's layout".to_string(), None))?;
        Ok(Restorable {
            payload,
            tokens: hit.meta.tokens[..held].to_vec(),
            bytes: files.iter().map(|f| f.1.len() as u64).sum(),
        })
    }

    /// A hit's whole payload, read and checked against its meta (length and
    /// CRC).
    fn verify(&self, hit: &DiskHit) -> Option<Vec<u8>> {
        match std::fs::read(hit.meta_path.with_file_name(&hit.meta.payload)) {
            Ok(bytes)
                if bytes.len() as u64 == hit.meta.payload_len
                    && crc32fast::hash(&bytes) == hit.meta.payload_crc =>
            {
                Some(bytes)
            }
            Ok(_) => {
                self.bad(hit, "payload does not match its checksum");
                None
            }
            Err(e) => {
                // Evicted by another server between listing and reading.
                if hit.meta_path.exists() {
                    self.bad(hit, &e.to_string());
                } else {
                    self.cache.forget(&self.dir, &hit.meta_path);
                }
                self.cache.stats.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Records a hit restored: counters, and the entry's last use.
    pub fn restored(&self, hit: &DiskHit, read: &Restorable) {
        let s = &self.cache.stats;
        s.hits.fetch_add(1, Ordering::Relaxed);
        s.hit_tokens.fetch_add(hit.tokens as u64, Ordering::Relaxed);
        s.bytes_read.fetch_add(read.bytes, Ordering::Relaxed);
        if let Ok(f) = std::fs::File::options().write(true).open(&hit.meta_path) {
            let _ = f.set_modified(SystemTime::now());
        }
    }

    /// A hit whose payload would not restore (the backend refused it).
    pub fn refused(&self, hit: &DiskHit, why: &str) {
        self.bad(hit, why);
        self.cache.stats.misses.fetch_add(1, Ordering::Relaxed);
    }

    fn bad(&self, hit: &DiskHit, why: &str) {
        tracing::warn!(file = %hit.meta_path.display(), why, "removing a bad disk cache entry");
        self.cache.stats.bad_entries.fetch_add(1, Ordering::Relaxed);
        remove_entry(&hit.meta_path, &hit.meta);
        self.cache.forget(&self.dir, &hit.meta_path);
        let blocks: std::collections::HashSet<String> =
            hit.meta.block_names().into_iter().collect();
        if !blocks.is_empty() {
            sweep_blocks(&self.dir, Some(&blocks));
        }
    }

    /// Whether `tokens` under `salt` should be written: long enough, not
    /// already held by an entry, writing not paused, and `bytes` (its size in
    /// RAM, about its size on disk) within the budget.
    pub fn wants(&self, tokens: &[u32], salt: u64, bytes: usize) -> bool {
        if tokens.len() < self.cache.opts.min_tokens
            || bytes as u64 > self.cache.opts.budget_bytes
            || self.cache.writes_paused()
        {
            return false;
        }
        !self
            .cache
            .metas(&self.dir)
            .iter()
            .any(|(_, m)| m.salt == salt && m.tokens.starts_with(tokens))
    }

    /// Whether a request that computed `computed` prompt tokens has its
    /// prompt written as soon as its prefill ends.
    pub fn saves_after_prefill(&self, computed: usize) -> bool {
        computed >= self.cache.opts.save_after_prefill
    }

    /// A temporary path for a payload that `commit` then puts in place.
    pub fn temp_payload(&self) -> (PathBuf, String) {
        let n = self.cache.counter.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}-{n}", self.cache.writer_id);
        (self.dir.join(format!("{name}.kv.tmp")), name)
    }

    /// Hands a payload written at `tmp` (by [`ModelDisk::temp_payload`]) to
    /// the writer thread as the entry for `tokens`.
    pub fn commit(
        &self,
        tmp: PathBuf,
        name: String,
        tokens: &[u32],
        salt: u64,
        keep_secs: Option<u64>,
    ) {
        let key = chain_key(&self.fp, salt, tokens);
        let meta = Meta {
            fingerprint: self.fp.0,
            salt,
            tokens: tokens.to_vec(),
            payload: format!("{key}-{name}.kv"),
            payload_len: 0,
            payload_crc: 0,
            created: now_secs(),
            keep_until: keep_secs.map_or(0, |k| now_secs() + k),
            model: self.model.clone(),
            backend: self.backend.clone(),
            layout: Vec::new(),
        };
        let job = WriteJob {
            dir: self.dir.clone(),
            key,
            payload: meta.payload.clone(),
            tmp: tmp.clone(),
            meta,
            layout: self.layout,
        };
        let (n, _) = &*self.cache.pending;
        *lock(n) += 1;
        let sent = lock(&self.cache.writer)
            .as_ref()
            .map(|w| w.send(job).is_ok())
            .unwrap_or(false);
        if !sent {
            let _ = std::fs::remove_file(tmp);
            let (n, cv) = &*self.cache.pending;
            *lock(n) -= 1;
            cv.notify_all();
        }
    }

    /// Counts a payload the backend could not write.
    pub fn write_failed(&self, tmp: &Path, why: &str) {
        let _ = std::fs::remove_file(tmp);
        self.cache
            .stats
            .write_errors
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(why, "could not write a prefix to the disk cache");
        let mut s = lock(&self.cache.state);
        s.last_error = Some(why.to_string());
        if why.contains("No space left") {
            s.paused_until = Some(Instant::now() + FULL_PAUSE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(tokens: Vec<u32>) -> Meta {
        Meta {
            fingerprint: [7; 32],
            salt: 3,
            tokens,
            payload: "k-1.kv".into(),
            payload_len: 10,
            payload_crc: 99,
            created: 5,
            keep_until: 0,
            model: "m".into(),
            backend: "llama".into(),
            layout: Vec::new(),
        }
    }

    #[test]
    fn meta_round_trips_and_any_damage_is_caught() {
        let m = meta((0..600).collect());
        let b = m.encode();
        let back = Meta::decode(&b).expect("decodes");
        assert_eq!(back.tokens, m.tokens);
        assert_eq!((back.salt, back.payload_len, back.payload_crc), (3, 10, 99));
        for cut in [0, 4, 40, b.len() - 1] {
            assert!(Meta::decode(&b[..cut]).is_err(), "truncated at {cut}");
        }
        for at in [0, 9, 60, b.len() / 2, b.len() - 2] {
            let mut bad = b.clone();
            bad[at] ^= 0x10;
            assert!(Meta::decode(&bad).is_err(), "flipped byte {at}");
        }
        // An older format with a valid checksum is refused too.
        let mut old = b[..b.len() - 4].to_vec();
        old[8..12].copy_from_slice(&0u32.to_le_bytes());
        let crc = crc32fast::hash(&old);
        old.extend_from_slice(&crc.to_le_bytes());
        assert!(Meta::decode(&old).unwrap_err().contains("format"));
    }

    #[test]
    fn keys_follow_the_tokens_the_salt_and_the_fingerprint() {
        let fp = Fingerprint([1; 32]);
        let a: Vec<u32> = (0..700).collect();
        assert_eq!(chain_key(&fp, 0, &a), chain_key(&fp, 0, &a.clone()));
        assert_ne!(chain_key(&fp, 0, &a), chain_key(&fp, 1, &a));
        assert_ne!(
            chain_key(&fp, 0, &a),
            chain_key(&Fingerprint([2; 32]), 0, &a)
        );
        assert_ne!(chain_key(&fp, 0, &a), chain_key(&fp, 0, &a[..699]));
    }

    fn open(dir: &Path, budget_bytes: u64, min_tokens: usize) -> Arc<DiskCache> {
        DiskCache::open(DiskCacheOptions {
            dir: dir.join("kv"),
            budget_bytes,
            min_tokens,
            save_after_prefill: DEFAULT_SAVE_AFTER_PREFILL,
        })
        .expect("open")
    }

    fn write_entry(disk: &ModelDisk, tokens: &[u32], salt: u64, payload: &[u8]) {
        let (tmp, name) = disk.temp_payload();
        std::fs::write(&tmp, payload).expect("write");
        disk.commit(tmp, name, tokens, salt, None);
        assert!(disk.cache.wait_idle(Duration::from_secs(60)));
    }

    #[test]
    fn entries_are_found_checked_superseded_and_kept_in_budget() {
        let root = tempfile::tempdir().expect("tmp");
        let cache = open(root.path(), 1 << 20, 4);
        let fp = Fingerprint([9; 32]);
        let disk = cache.for_model(fp, "m", "llama").expect("model");
        let short: Vec<u32> = (0..300).collect();
        assert!(disk.wants(&short, 0, 100));
        write_entry(&disk, &short, 0, &[1u8; 3000]);
        assert!(!disk.wants(&short[..200], 0, 100), "already held");
        let prompt: Vec<u32> = (0..1000).collect();
        let hit = disk.lookup(&prompt, 0, 0).expect("hit");
        assert_eq!((hit.tokens, hit.stored), (300, 300));
        assert!(disk.verify(&hit).is_some());
        assert!(disk.lookup(&prompt, 5, 0).is_none(), "another salt");
        assert!(
            disk.lookup(&prompt, 0, 200).is_none(),
            "no block better than RAM"
        );
        // A longer entry supersedes the one it extends.
        let long: Vec<u32> = (0..900).collect();
        write_entry(&disk, &long, 0, &[2u8; 5000]);
        assert_eq!(cache.entries().len(), 1);
        assert_eq!(disk.lookup(&prompt, 0, 0).expect("hit").tokens, 900);
        // A flipped payload byte is caught and the entry removed.
        let hit = disk.lookup(&prompt, 0, 0).expect("hit");
        let payload = hit.meta_path.with_file_name(&hit.meta.payload);
        let mut bytes = std::fs::read(&payload).expect("read");
        bytes[100] ^= 1;
        std::fs::write(&payload, bytes).expect("write");
        assert!(disk.verify(&hit).is_none());
        assert!(disk.lookup(&prompt, 0, 0).is_none());
        assert_eq!(cache.summary().bad_entries, 1);
        // The budget evicts the least recently used.
        for i in 0..5u32 {
            let t: Vec<u32> = (0..300).map(|x| x + 10_000 * (i + 1)).collect();
            write_entry(&disk, &t, 0, &vec![3u8; 300_000]);
        }
        let s = cache.summary();
        assert!(s.bytes <= 1 << 20, "{} bytes", s.bytes);
        assert!(s.evictions >= 2);
        assert_eq!(cache.clear(Some("other")), 0);
        assert!(cache.clear(None) >= 1);
        assert_eq!(cache.summary().entries, 0);
    }

    /// A payload of a made-up backend: a tag, the count, then two runs of
    /// rows: each position's token, and its token times three as u64.
    fn fake_payload(tokens: &[u32]) -> Vec<u8> {
        let mut b = b"FAKE".to_vec();
        b.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
        for t in tokens {
            b.extend_from_slice(&t.to_le_bytes());
        }
        for t in tokens {
            b.extend_from_slice(&(u64::from(*t) * 3).to_le_bytes());
        }
        b
    }

    fn fake_layout(b: &[u8]) -> Option<Layout> {
        if b.get(..4)? != b"FAKE" {
            return None;
        }
        let n = u32::from_le_bytes(b.get(4..8)?.try_into().ok()?) as usize;
        Some(Layout {
            pieces: vec![
                Piece::Fixed(b"FAKE".to_vec()),
                Piece::Count,
                Piece::Rows {
                    width: 4,
                    cells: false,
                },
                Piece::Rows {
                    width: 8,
                    cells: false,
                },
            ],
            rows: n,
            order: None,
        })
    }

    fn read_hit(disk: &ModelDisk, prompt: &[u32]) -> Option<(usize, Vec<u32>, Vec<u8>)> {
        let hit = disk.lookup(prompt, 0, 0)?;
        let read = disk.open(&hit)?;
        disk.restored(&hit, &read);
        Some((hit.tokens, read.tokens.clone(), read.payload))
    }

    #[test]
    fn prompts_sharing_a_prefix_share_its_blocks_and_read_only_what_they_need() {
        let root = tempfile::tempdir().expect("tmp");
        let cache = open(root.path(), 1 << 30, 4);
        let disk = cache
            .for_model(Fingerprint([4; 32]), "m", "fake")
            .expect("model")
            .with_layout(Some(fake_layout));
        // Two agents: the same 600-token system prompt, then their own words.
        let shared: Vec<u32> = (0..600).collect();
        let a: Vec<u32> = shared.iter().copied().chain(5000..5300).collect();
        let b: Vec<u32> = shared.iter().copied().chain(7000..7200).collect();
        write_entry(&disk, &a, 0, &fake_payload(&a));
        let s = cache.summary();
        assert_eq!(
            (s.entries, s.blocks, s.blocks_written, s.blocks_shared),
            (1, 4, 4, 0)
        );
        assert!(
            !root
                .path()
                .join("kv")
                .read_dir()
                .expect("ls")
                .flatten()
                .any(|d| d
                    .path()
                    .read_dir()
                    .expect("ls")
                    .flatten()
                    .any(|f| f.path().extension().is_some_and(|x| x == "kv"))),
            "no whole payload is kept"
        );
        write_entry(&disk, &b, 0, &fake_payload(&b));
        let s = cache.summary();
        // Blocks 0 and 1 (512 tokens) are a's; b's third block differs.
        assert_eq!(
            (s.entries, s.blocks, s.blocks_written, s.blocks_shared),
            (2, 6, 6, 2)
        );
        // A hit reads the blocks it needs, joined into the backend's format.
        let mut q: Vec<u32> = b.clone();
        q.push(1);
        let (n, held, bytes) = read_hit(&disk, &q).expect("b hit");
        assert_eq!((n, held.len()), (800, 800));
        assert_eq!(bytes, fake_payload(&b));
        let q: Vec<u32> = shared[..300].iter().copied().chain([9, 9]).collect();
        let before = cache.summary().bytes_read;
        let (n, held, bytes) = read_hit(&disk, &q).expect("shared hit");
        assert_eq!((n, held.len()), (300, 512), "two blocks read");
        assert_eq!(bytes, fake_payload(&a[..512]));
        assert_eq!(cache.summary().bytes_read - before, 2 * (20 + 256 * 12));
        // A listing counts each entry's blocks, shared ones too.
        assert!(cache.entries().iter().all(|e| e.blocks == 4));
        // Clearing one entry keeps the blocks the other holds.
        let a_meta = disk
            .cache
            .metas(&disk.dir)
            .into_iter()
            .find(|(_, m)| m.tokens == a)
            .expect("a");
        remove_entry(&a_meta.0, &a_meta.1);
        let a_blocks: std::collections::HashSet<String> =
            a_meta.1.block_names().into_iter().collect();
        sweep_blocks(&disk.dir, Some(&a_blocks));
        assert_eq!(cache.summary().blocks, 4);
        let (_, _, bytes) = read_hit(&disk, &q).expect("shared hit");
        assert_eq!(bytes, fake_payload(&a[..512]));
        // A damaged block is caught: the entry goes, with the bad block.
        let bad = disk.dir.join(&a_meta.1.block_names()[1]);
        let mut file = std::fs::read(&bad).expect("block");
        file[40] ^= 1;
        std::fs::write(&bad, file).expect("write");
        let hit = disk.lookup(&q, 0, 0).expect("hit");
        assert!(disk.open(&hit).is_none());
        assert!(!bad.exists());
        let s = cache.summary();
        assert_eq!((s.entries, s.blocks, s.bad_entries), (0, 0, 1));
        // A payload the layout does not read is kept whole.
        let odd: Vec<u32> = (0..300).collect();
        let mut payload = fake_payload(&odd);
        payload.push(0);
        write_entry(&disk, &odd, 0, &payload);
        let s = cache.summary();
        assert_eq!((s.entries, s.blocks), (1, 0));
        let (_, _, bytes) = read_hit(&disk, &[odd.clone(), vec![1]].concat()).expect("whole hit");
        assert_eq!(bytes, payload);
        assert_eq!(cache.clear(None), 1);
    }

    #[test]
    fn the_budget_frees_a_block_only_with_the_last_entry_holding_it() {
        let root = tempfile::tempdir().expect("tmp");
        // Room for about six blocks of 256 positions (12 bytes each).
        let cache = open(root.path(), 6 * (256 * 12 + 20) + 4096, 4);
        let disk = cache
            .for_model(Fingerprint([5; 32]), "m", "fake")
            .expect("model")
            .with_layout(Some(fake_layout));
        let shared: Vec<u32> = (0..512).collect();
        let mk =
            |tail: u32| -> Vec<u32> { shared.iter().copied().chain(tail..tail + 256).collect() };
        write_entry(&disk, &mk(10_000), 0, &fake_payload(&mk(10_000)));
        write_entry(&disk, &mk(20_000), 0, &fake_payload(&mk(20_000)));
        // Four blocks: the shared two, and a tail each.
        assert_eq!(cache.summary().blocks, 4);
        write_entry(&disk, &mk(30_000), 0, &fake_payload(&mk(30_000)));
        write_entry(&disk, &mk(40_000), 0, &fake_payload(&mk(40_000)));
        // Six blocks would not fit beside the metas: the oldest entry went
        // with its own tail, the shared blocks stayed.
        let s = cache.summary();
        assert!(s.evictions >= 1);
        assert!(s.bytes <= 6 * (256 * 12 + 20) + 4096, "{} bytes", s.bytes);
        assert_eq!(s.blocks, 2 + s.entries);
        let (n, _, _) = read_hit(&disk, &mk(40_000)).expect("newest kept");
        assert_eq!(n, 767);
    }

    #[test]
    fn files_and_folders_are_private() {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let root = tempfile::tempdir().expect("tmp");
            let cache = open(root.path(), 1 << 20, 1);
            let disk = cache
                .for_model(Fingerprint([1; 32]), "m", "mlx")
                .expect("m");
            let mut f = private_file(&root.path().join("x")).expect("file");
            f.write_all(b"x").expect("w");
            let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
            assert_eq!(mode(&root.path().join("kv")), 0o700);
            assert_eq!(mode(&disk.dir), 0o700);
            assert_eq!(mode(&root.path().join("x")), 0o600);
        }
    }
}
