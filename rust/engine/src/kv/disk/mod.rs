//! The prefix cache's disk tier (after SGLang's HiCache): every whole page a request computes is
//! also written, by a thread of its own, to a file of fixed-size slots under `hicache_dir`; a
//! prompt whose next pages are not in memory but on disk gets them read back instead of
//! recomputed. The file outlives the process: start-up indexes its records again, and every
//! read is checked (payload CRC, page identity), so a truncated or corrupt record is dropped and
//! recomputed, never served.
//!
//! Pages are written when computed (write-through), not when memory evicts them: eviction then
//! costs nothing on the engine thread, and a killed server keeps every page it had finished
//! writing. The file's own eviction is LRU over its leaves (pages no other page on disk
//! continues), as the radix tree's is, so a prefix is never dropped before its continuations.

mod record;

use record::Layout;
pub(crate) use record::{page_hashes, PageHash, PageRecord};

use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Bytes of pages waiting for the writer; past this a page is not written (counted as dropped)
/// rather than let a slow disk hold the engine's memory.
const MAX_IN_FLIGHT_BYTES: usize = 256 << 20;

/// Where the tier lives and how much of the disk it may take.
pub struct DiskTierOptions {
    pub dir: PathBuf,
    pub capacity_bytes: u64,
    /// Identity of the model, its precision and KV layout; files of another are left alone.
    pub fingerprint: u64,
}

/// What the disk tier holds and has done, for `/get_server_info` and `/metrics`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DiskTierStats {
    pub path: String,
    /// What start-up found, for the log.
    pub startup: String,
    #[serde(flatten)]
    pub counts: DiskTierCounts,
}

/// The disk tier's numbers: all that changes after start-up, so publishing them every step
/// copies no strings.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct DiskTierCounts {
    pub capacity_pages: usize,
    pub used_pages: usize,
    /// Prompt tokens read back from disk at admission (first admissions, as cache_hit_tokens).
    pub hit_tokens: u64,
    pub read_pages: u64,
    pub read_bytes: u64,
    pub written_pages: u64,
    pub written_bytes: u64,
    /// Pages not written because the writer was too far behind, or its write failed.
    pub dropped_pages: u64,
    /// Records that failed their checks when read (recomputed instead).
    pub rejected_pages: u64,
    /// Records indexed at start-up, and records found there but ignored (truncated, corrupt).
    pub recovered_pages: usize,
    pub ignored_records: usize,
}

struct Entry {
    slot: u32,
    parent: PageHash,
    /// Entries on disk continuing this page: only those with none are evicted.
    children: u32,
    last_access: u64,
    /// The whole slot until the writer has written it: reads take it from here meanwhile.
    staged: Option<Arc<Vec<u8>>>,
}

enum Job {
    Write {
        slot: u32,
        bytes: Arc<Vec<u8>>,
    },
    /// Drops every record (the cache was flushed).
    Clear,
}

struct Written {
    slot: u32,
    bytes: Arc<Vec<u8>>,
    error: Option<String>,
}

pub(crate) struct DiskTier {
    layout: Layout,
    file: Arc<File>,
    entries: HashMap<PageHash, Entry>,
    /// Leaf entries by (last access, slot): eviction order.
    leaves: BTreeSet<(u64, u32)>,
    /// The page in each slot used so far (slots are taken in order, so the file grows as needed).
    slot_owner: Vec<Option<PageHash>>,
    free_slots: Vec<u32>,
    capacity: usize,
    tick: u64,
    jobs: Option<Sender<Job>>,
    written: Receiver<Written>,
    writer: Option<JoinHandle<()>>,
    in_flight_bytes: usize,
    read_buffer: Vec<u8>,
    path: String,
    startup: String,
    counts: DiskTierCounts,
}

impl DiskTier {
    /// Opens (or starts) the cache file of this fingerprint under `options.dir` and indexes the
    /// records it holds. `payload_bytes` is one page's K/V over every layer.
    pub fn open(options: &DiskTierOptions, page_size: usize, payload_bytes: usize) -> std::io::Result<DiskTier> {
        let layout = Layout { fingerprint: options.fingerprint, page_size, payload_bytes };
        let capacity = options.capacity_bytes.saturating_sub(record::ALIGN as u64) / layout.slot_bytes() as u64;
        if capacity == 0 {
            return Err(std::io::Error::other(format!("hicache_size_gb is too small for one page ({} bytes); raise it", layout.slot_bytes() + record::ALIGN)));
        }
        std::fs::create_dir_all(&options.dir)?;
        let path = options.dir.join(format!("kv-{:016x}.rsglkv", options.fingerprint));
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
        let mut notes = vec![others_left_alone(&options.dir, &path)];
        let mut header = vec![0u8; record::ALIGN];
        let readable = file.read_exact_at(&mut header, 0).is_ok();
        let valid = readable && layout.check_file_header(&header).map_err(|why| notes.push(format!("ignored {}: {why}", path.display()))).is_ok();
        if !valid {
            file.set_len(0)?;
            file.write_all_at(&layout.file_header(), 0)?;
        }
        let file = Arc::new(file);
        let (jobs, written, writer) = spawn_writer(file.clone(), layout)?;
        let mut tier = DiskTier {
            layout,
            file,
            entries: HashMap::new(),
            leaves: BTreeSet::new(),
            slot_owner: Vec::new(),
            free_slots: Vec::new(),
            capacity: capacity as usize,
            tick: 0,
            jobs: Some(jobs),
            written,
            writer: Some(writer),
            in_flight_bytes: 0,
            read_buffer: Vec::new(),
            path: path.display().to_string(),
            startup: String::new(),
            counts: DiskTierCounts { capacity_pages: capacity as usize, ..Default::default() },
        };
        tier.recover()?;
        notes.insert(0, format!("{} pages recovered from {}", tier.counts.recovered_pages, path.display()));
        if tier.counts.ignored_records > 0 {
            notes.push(format!("{} truncated or corrupt records ignored", tier.counts.ignored_records));
        }
        tier.startup = notes.into_iter().filter(|n| !n.is_empty()).collect::<Vec<_>>().join("; ");
        Ok(tier)
    }

    /// Indexes the records of the file's slots; a slot cut short by the file's end, or whose
    /// header fails its checks, is free again.
    fn recover(&mut self) -> std::io::Result<()> {
        let file_len = self.file.metadata()?.len();
        let in_file = (file_len.saturating_sub(record::ALIGN as u64)).div_ceil(self.layout.slot_bytes() as u64);
        self.slot_owner = vec![None; (in_file as usize).min(self.capacity)];
        let mut header = vec![0u8; self.layout.header_bytes()];
        for slot in (0..self.slot_owner.len() as u32).rev() {
            let at = self.layout.slot_offset(slot);
            let complete = at + self.layout.slot_bytes() as u64 <= file_len;
            let record = match complete && self.file.read_exact_at(&mut header, at).is_ok() {
                true => self.layout.decode_header(&header),
                false => Err("truncated"),
            };
            match record {
                Ok((record, _)) if !self.entries.contains_key(&record.hash) => {
                    self.slot_owner[slot as usize] = Some(record.hash);
                    let entry = Entry { slot, parent: record.parent, children: 0, last_access: 0, staged: None };
                    self.entries.insert(record.hash, entry);
                }
                Err("no record") => self.free_slots.push(slot),
                _ => {
                    self.counts.ignored_records += 1;
                    self.free_slots.push(slot);
                }
            }
        }
        let parents: Vec<PageHash> = self.entries.values().map(|e| e.parent).collect();
        parents.iter().for_each(|p| self.entries.get_mut(p).into_iter().for_each(|e| e.children += 1));
        self.leaves = self.entries.values().filter(|e| e.children == 0).map(|e| (e.last_access, e.slot)).collect();
        self.counts.recovered_pages = self.entries.len();
        // Slots past a smaller capacity than the file was written with are gone.
        self.file.set_len(file_len.min(self.layout.slot_offset(self.capacity as u32)))
    }

    /// How many of `hashes` (a prompt's next pages, in order) are on disk, from the first.
    pub fn find(&self, hashes: &[PageHash]) -> usize {
        hashes.iter().take_while(|h| self.entries.contains_key(h)).count()
    }

    /// Asks the kernel to read the records of `hashes` that are on disk (a waiting request's),
    /// so they are in memory by the time it is admitted.
    pub fn prefetch(&self, hashes: &[PageHash]) {
        for entry in hashes.iter().filter_map(|h| self.entries.get(h)).filter(|e| e.staged.is_none()) {
            let at = self.layout.slot_offset(entry.slot) as libc::off_t;
            // SAFETY: a plain advisory call on a file descriptor this tier owns.
            unsafe { libc::posix_fadvise(self.file.as_raw_fd(), at, self.layout.slot_bytes() as libc::off_t, libc::POSIX_FADV_WILLNEED) };
        }
    }

    /// Reads the page `expected` names and hands its K/V bytes to `apply`. False when it is not
    /// on disk or its record fails a check against `expected` (then it is dropped, and logged).
    pub fn read(&mut self, expected: &PageRecord, apply: impl FnOnce(&[u8])) -> bool {
        self.collect_written();
        let hash = expected.hash;
        let Some(entry) = self.entries.get(&hash) else { return false };
        let slot = entry.slot;
        let staged = entry.staged.clone();
        if staged.is_none() {
            self.read_buffer.resize(self.layout.slot_bytes(), 0);
            if self.file.read_exact_at(&mut self.read_buffer, self.layout.slot_offset(slot)).is_err() {
                self.read_buffer.clear(); // the file was cut short under us: the check below fails
            }
        }
        let bytes = staged.as_deref().map_or(&self.read_buffer[..], |s| &s[..]);
        let Some(payload) = self.layout.payload(bytes, expected) else {
            eprintln!("rsgl: disk KV cache: slot {slot} failed its checks (truncated or corrupt); recomputing its page");
            self.counts.rejected_pages += 1;
            self.remove(hash);
            return false;
        };
        apply(payload);
        self.counts.read_pages += 1;
        self.counts.read_bytes += self.layout.payload_bytes as u64;
        self.touch(hash);
        true
    }

    /// Writes the page `record`, its K/V bytes filled in by `fill`, unless it is on disk already
    /// (then it only counts as used now).
    pub fn store(&mut self, record: PageRecord, fill: impl FnOnce(&mut [u8])) {
        self.collect_written();
        let (hash, parent) = (record.hash, record.parent);
        if self.entries.contains_key(&hash) {
            self.touch(hash);
            return;
        }
        if self.in_flight_bytes + self.layout.slot_bytes() > MAX_IN_FLIGHT_BYTES {
            self.counts.dropped_pages += 1;
            return;
        }
        let Some(slot) = self.take_slot() else { return };
        let bytes = Arc::new(self.layout.encode(&record, fill));
        self.in_flight_bytes += bytes.len();
        if let Some(p) = self.entries.get_mut(&parent) {
            if p.children == 0 {
                self.leaves.remove(&(p.last_access, p.slot));
            }
            p.children += 1;
        }
        self.tick += 1;
        self.entries.insert(hash, Entry { slot, parent, children: 0, last_access: self.tick, staged: Some(bytes.clone()) });
        self.leaves.insert((self.tick, slot));
        self.slot_owner[slot as usize] = Some(hash);
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job::Write { slot, bytes });
        }
    }

    /// Forgets every record and empties the file.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.leaves.clear();
        self.slot_owner.clear();
        self.free_slots.clear();
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job::Clear);
        }
    }

    pub fn stats(&mut self) -> DiskTierStats {
        DiskTierStats { path: self.path.clone(), startup: self.startup.clone(), counts: self.counts() }
    }

    /// [`Self::stats`] without the strings, which do not change.
    pub fn counts(&mut self) -> DiskTierCounts {
        self.collect_written();
        self.counts.used_pages = self.entries.len();
        self.counts
    }

    pub fn count_hit_tokens(&mut self, tokens: usize) {
        self.counts.hit_tokens += tokens as u64;
    }

    /// Takes the writer's reports: written slots no longer need their staged copy; a failed
    /// write drops its record.
    fn collect_written(&mut self) {
        while let Ok(Written { slot, bytes, error }) = self.written.try_recv() {
            self.in_flight_bytes -= bytes.len();
            let owner = self.slot_owner.get(slot as usize).copied().flatten(); // none after a clear
            let current = owner.filter(|h| self.entries[h].staged.as_ref().is_some_and(|s| Arc::ptr_eq(s, &bytes)));
            match error {
                None => {
                    self.counts.written_pages += 1;
                    self.counts.written_bytes += bytes.len() as u64;
                    if let Some(hash) = current {
                        self.entries.get_mut(&hash).expect("owned slot").staged = None;
                    }
                }
                Some(e) => {
                    eprintln!("rsgl: disk KV cache: writing slot {slot} failed: {e}");
                    self.counts.dropped_pages += 1;
                    current.into_iter().for_each(|hash| self.remove(hash));
                }
            }
        }
    }

    /// Counts `hash` as used now.
    fn touch(&mut self, hash: PageHash) {
        self.tick += 1;
        let entry = self.entries.get_mut(&hash).expect("touched entries exist");
        if entry.children == 0 {
            self.leaves.remove(&(entry.last_access, entry.slot));
            self.leaves.insert((self.tick, entry.slot));
        }
        entry.last_access = self.tick;
    }

    /// A slot for a new record: a free one, the next never used, or the least recently used
    /// leaf's.
    fn take_slot(&mut self) -> Option<u32> {
        if let Some(slot) = self.free_slots.pop() {
            return Some(slot);
        }
        if self.slot_owner.len() < self.capacity {
            self.slot_owner.push(None);
            return Some(self.slot_owner.len() as u32 - 1);
        }
        self.evict_leaf()
    }

    /// Frees the least recently used leaf's slot.
    fn evict_leaf(&mut self) -> Option<u32> {
        let (_, slot) = *self.leaves.first()?;
        let hash = self.slot_owner[slot as usize].expect("leaves own their slot");
        self.remove(hash);
        self.free_slots.pop()
    }

    /// Drops the record of `hash` and frees its slot.
    fn remove(&mut self, hash: PageHash) {
        let Some(entry) = self.entries.remove(&hash) else { return };
        if entry.children == 0 {
            self.leaves.remove(&(entry.last_access, entry.slot));
        }
        if let Some(p) = self.entries.get_mut(&entry.parent) {
            p.children -= 1;
            if p.children == 0 {
                self.leaves.insert((p.last_access, p.slot));
            }
        }
        self.slot_owner[entry.slot as usize] = None;
        self.free_slots.push(entry.slot);
    }
}

impl Drop for DiskTier {
    /// Waits for the writer to write every page it was given, so a clean shutdown keeps them.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// The writer thread: it writes each slot it is given at its place in `file`, in order, and
/// reports back; it ends when the tier drops its end of the queue.
fn spawn_writer(file: Arc<File>, layout: Layout) -> std::io::Result<(Sender<Job>, Receiver<Written>, JoinHandle<()>)> {
    let (jobs, queue) = channel::<Job>();
    let (done, written) = channel();
    let writer = std::thread::Builder::new().name("rsgl-hicache-writer".into()).spawn(move || {
        for job in queue {
            match job {
                Job::Write { slot, bytes } => {
                    let error = file.write_all_at(&bytes, layout.slot_offset(slot)).err().map(|e| e.to_string());
                    let _ = done.send(Written { slot, bytes, error });
                }
                Job::Clear => {
                    if let Err(e) = file.set_len(record::ALIGN as u64) {
                        eprintln!("rsgl: could not empty the disk KV cache: {e}");
                    }
                }
            }
        }
    })?;
    Ok((jobs, written, writer))
}

/// A note naming the other cache files in `dir` (other models or settings), which are kept.
fn others_left_alone(dir: &Path, ours: &Path) -> String {
    let others = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok()).filter(|e| e.path() != ours && e.path().extension().is_some_and(|x| x == "rsglkv")).count())
        .unwrap_or(0);
    match others {
        0 => String::new(),
        n => format!("{n} cache files of other models or settings left alone"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 2;
    const PAYLOAD: usize = 3000;

    /// A fresh folder for one test's cache file.
    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rsgl-disk-tier-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn open(dir: &Path, slots: u64, fingerprint: u64) -> DiskTier {
        let slot = Layout { fingerprint, page_size: PAGE, payload_bytes: PAYLOAD }.slot_bytes() as u64;
        let options = DiskTierOptions { dir: dir.to_path_buf(), capacity_bytes: record::ALIGN as u64 + slots * slot, fingerprint };
        DiskTier::open(&options, PAGE, PAYLOAD).expect("the tier opens")
    }

    /// The records of a sequence's pages.
    fn sequence(tokens: &[u32]) -> Vec<PageRecord> {
        let hashes = page_hashes(0, tokens, PAGE);
        (0..hashes.len()).map(|p| PageRecord::in_chain(0, &hashes, p, &tokens[p * PAGE..(p + 1) * PAGE])).collect()
    }

    fn store_all(tier: &mut DiskTier, tokens: &[u32]) {
        for record in sequence(tokens) {
            let first = record.tokens[0] as u8;
            tier.store(record, |out| out.fill(first));
        }
    }

    /// Pages of `tokens` read back in order, as the first byte of each payload.
    fn read_all(tier: &mut DiskTier, tokens: &[u32]) -> Vec<u8> {
        let mut firsts = Vec::new();
        for record in sequence(tokens) {
            let mut first = None;
            if !tier.read(&record, |bytes| first = Some(bytes[0])) {
                break;
            }
            firsts.push(first.expect("read pages are applied"));
        }
        firsts
    }

    /// Waits until the writer has written every page handed to it.
    fn settle(tier: &mut DiskTier) {
        while tier.in_flight_bytes > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
            tier.collect_written();
        }
    }

    #[test]
    fn pages_survive_a_restart_and_other_models_files_are_left_alone() {
        let dir = folder("restart");
        let mut tier = open(&dir, 8, 1);
        store_all(&mut tier, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(read_all(&mut tier, &[1, 2, 3, 4, 5, 6]), vec![1, 3, 5], "read from the staged copy or the file");
        drop(tier); // waits for the writer
        let mut other = open(&dir, 8, 2);
        assert_eq!(other.find(&page_hashes(0, &[1, 2, 3, 4], PAGE)), 0, "another fingerprint sees nothing");
        assert!(other.stats().startup.contains("1 cache files of other models"), "{}", other.stats().startup);
        drop(other);
        let mut again = open(&dir, 8, 1);
        assert_eq!(again.counts().recovered_pages, 3);
        assert_eq!(again.find(&page_hashes(0, &[1, 2, 3, 4, 9, 9], PAGE)), 2);
        assert_eq!(read_all(&mut again, &[1, 2, 3, 4, 5, 6]), vec![1, 3, 5]);
        assert_eq!(read_all(&mut again, &[1, 2, 3, 4, 5, 7]), vec![1, 3], "a page holding other tokens is not served");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn corrupt_and_truncated_records_are_never_served() {
        let dir = folder("corrupt");
        let mut tier = open(&dir, 8, 1);
        store_all(&mut tier, &[1, 2, 3, 4, 5, 6]);
        settle(&mut tier);
        let path = PathBuf::from(tier.stats().path);
        let layout = tier.layout;
        drop(tier);
        let file = OpenOptions::new().write(true).open(&path).expect("the cache file");
        // Slots are taken from 0: flip a payload byte of the second page, cut the third short.
        file.write_all_at(&[0xff], layout.slot_offset(1) + record::ALIGN as u64 + 7).expect("written");
        file.set_len(layout.slot_offset(2) + 100).expect("cut");
        let mut tier = open(&dir, 8, 1);
        assert_eq!((tier.counts().recovered_pages, tier.counts().ignored_records), (2, 1), "the cut record is ignored at start-up");
        assert_eq!(read_all(&mut tier, &[1, 2, 3, 4, 5, 6]), vec![1], "the corrupt page is caught when read");
        assert_eq!((tier.counts().rejected_pages, tier.counts().used_pages), (1, 1), "and dropped");
        store_all(&mut tier, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(read_all(&mut tier, &[1, 2, 3, 4, 5, 6]), vec![1, 3, 5], "recomputed pages are written again");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_full_tier_evicts_least_recently_used_leaves_first() {
        let dir = folder("lru");
        let mut tier = open(&dir, 4, 1);
        store_all(&mut tier, &[1, 1, 2, 2]); // a chain of two pages
        store_all(&mut tier, &[7, 7]);
        store_all(&mut tier, &[8, 8]);
        assert_eq!(read_all(&mut tier, &[1, 1, 2, 2]), vec![1, 2], "the chain is now the most recent");
        store_all(&mut tier, &[9, 9]); // full: [7 7] goes
        assert_eq!((read_all(&mut tier, &[7, 7]), read_all(&mut tier, &[8, 8])), (vec![], vec![8]));
        store_all(&mut tier, &[6, 6]); // the oldest leaf is the chain's second page
        assert_eq!(read_all(&mut tier, &[1, 1, 2, 2]), vec![1], "its first page, used before it, stayed: only leaves go");
        store_all(&mut tier, &[5, 5]); // now [9 9] is the oldest leaf
        assert_eq!(read_all(&mut tier, &[9, 9]), Vec::<u8>::new());
        assert_eq!(read_all(&mut tier, &[8, 8]), vec![8]);
        assert_eq!(tier.counts().used_pages, 4);
        store_all(&mut tier, &[4, 4]);
        tier.clear(); // before the writer reports the last page written
        assert_eq!((read_all(&mut tier, &[8, 8]), tier.counts().used_pages), (vec![], 0));
        settle(&mut tier);
        store_all(&mut tier, &[3, 3]);
        assert_eq!(read_all(&mut tier, &[3, 3]), vec![3], "the first slot again");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn statistics_are_one_flat_record_whose_counts_move() {
        let dir = folder("stats");
        let mut tier = open(&dir, 8, 1);
        store_all(&mut tier, &[1, 2, 3, 4]);
        settle(&mut tier);
        let counts = tier.counts();
        assert_eq!((counts.used_pages, counts.written_pages, counts.capacity_pages), (2, 2, 8));
        // The counts sit beside the path and the start-up notes, as one record's keys.
        let stats = serde_json::to_value(tier.stats()).expect("statistics serialize");
        assert_eq!(stats["written_pages"], 2);
        assert_eq!(stats["path"], tier.path.as_str());
        assert!(stats["startup"].as_str().is_some_and(|notes| notes.contains("0 pages recovered")));
        assert!(stats.get("counts").is_none());
        drop(tier);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
