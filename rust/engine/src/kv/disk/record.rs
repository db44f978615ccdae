//! The disk tier's file format: a file header naming the cache it belongs to, then one fixed-size
//! slot per page. A slot holds a record header (which page: its prefix hash, its parent's, its
//! tokens; CRC32 of the payload and of the header itself) and the page's K/V bytes.
//!
//! A page is named by a chain of SHA-256 hashes over the namespace and every token up to the
//! page's end, as vLLM's prefix caching names blocks: equal names mean equal prefixes (a cache
//! shared across requests must not be fooled by crafted collisions), and a record can be
//! checked on its own, without its ancestors.

use sha2::{Digest, Sha256};

/// Slots start on this boundary in the file, and payloads on it within a slot.
pub(super) const ALIGN: usize = 4096;
const FILE_MAGIC: [u8; 8] = *b"RSGLKVF1";
const RECORD_MAGIC: [u8; 8] = *b"RSGLKVP1";
/// Magic, fingerprint, hash, parent, depth, page size, payload CRC.
const RECORD_FIXED: usize = 8 + 8 + 16 + 16 + 4 + 4 + 4;

/// The name of a page: its namespace and every token up to its end, hashed in a chain.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct PageHash(pub [u8; 16]);

impl PageHash {
    /// The (empty) prefix every chain of `namespace` starts from.
    pub fn root(namespace: u64) -> PageHash {
        PageHash::digest(&[b"rsgl-root".as_slice(), &namespace.to_le_bytes()])
    }

    /// The page after `self` holding `tokens`.
    pub fn next(self, tokens: &[u32]) -> PageHash {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        PageHash::digest(&[&self.0, &bytes])
    }

    fn digest(parts: &[&[u8]]) -> PageHash {
        let mut hasher = Sha256::new();
        parts.iter().for_each(|p| hasher.update(p));
        let full = hasher.finalize();
        PageHash(full[..16].try_into().expect("SHA-256 has 32 bytes"))
    }
}

/// The names of the whole pages of `tokens` in `namespace`, in order.
pub(crate) fn page_hashes(namespace: u64, tokens: &[u32], page_size: usize) -> Vec<PageHash> {
    let mut hash = PageHash::root(namespace);
    tokens
        .chunks_exact(page_size)
        .map(|page| {
            hash = hash.next(page);
            hash
        })
        .collect()
}

/// What every slot of one cache file has in common.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Layout {
    /// Identity of the model, its precision and the KV layout: a file of another is never read.
    pub fingerprint: u64,
    pub page_size: usize,
    /// Bytes of one page's K and V over every layer.
    pub payload_bytes: usize,
}

impl Layout {
    /// Bytes of a record's header at the start of its slot.
    pub fn header_bytes(&self) -> usize {
        RECORD_FIXED + 4 * self.page_size + 4
    }

    fn payload_offset(&self) -> usize {
        self.header_bytes().next_multiple_of(ALIGN)
    }

    pub fn slot_bytes(&self) -> usize {
        (self.payload_offset() + self.payload_bytes).next_multiple_of(ALIGN)
    }

    /// Where slot `slot` starts in the file (after the file header).
    pub fn slot_offset(&self, slot: u32) -> u64 {
        (ALIGN + slot as usize * self.slot_bytes()) as u64
    }

    /// The file header: this layout, checked by a CRC.
    pub fn file_header(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ALIGN);
        out.extend_from_slice(&FILE_MAGIC);
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        out.extend_from_slice(&(self.page_size as u64).to_le_bytes());
        out.extend_from_slice(&(self.payload_bytes as u64).to_le_bytes());
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out.resize(ALIGN, 0);
        out
    }

    /// Why `header` (a file's first bytes) is not this layout's, if it is not.
    pub fn check_file_header(&self, header: &[u8]) -> Result<(), &'static str> {
        let ours = self.file_header();
        if header.len() < ALIGN || header[..8] != FILE_MAGIC {
            return Err("not an rsgl KV cache file");
        }
        let body = 8 + 8 * 3;
        if crc32fast::hash(&header[..body]).to_le_bytes() != header[body..body + 4] {
            return Err("its header is corrupt");
        }
        if header[8..16] != ours[8..16] {
            return Err("it was written for another model or other settings");
        }
        if header[..body] != ours[..body] {
            return Err("its page layout differs");
        }
        Ok(())
    }

    /// A whole slot: the record header, then the payload `fill` writes at its offset (in
    /// place: a page is copied once on its way to the file).
    pub fn encode(&self, record: &PageRecord, fill: impl FnOnce(&mut [u8])) -> Vec<u8> {
        debug_assert_eq!(record.tokens.len(), self.page_size);
        let mut slot = vec![0u8; self.slot_bytes()];
        let start = self.payload_offset();
        fill(&mut slot[start..start + self.payload_bytes]);
        let payload_crc = crc32fast::hash(&slot[start..start + self.payload_bytes]);
        let mut out = Vec::with_capacity(self.header_bytes());
        out.extend_from_slice(&RECORD_MAGIC);
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        out.extend_from_slice(&record.hash.0);
        out.extend_from_slice(&record.parent.0);
        out.extend_from_slice(&record.depth.to_le_bytes());
        out.extend_from_slice(&(self.page_size as u32).to_le_bytes());
        out.extend_from_slice(&payload_crc.to_le_bytes());
        record.tokens.iter().for_each(|t| out.extend_from_slice(&t.to_le_bytes()));
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        slot[..out.len()].copy_from_slice(&out);
        slot
    }

    /// The record a slot's header describes (its first [`Self::header_bytes`] bytes), with its
    /// payload's CRC; an error says why it is not a record of this layout.
    pub fn decode_header(&self, slot: &[u8]) -> Result<(PageRecord, u32), &'static str> {
        let end = self.header_bytes();
        if slot.len() < end || slot[..8] != RECORD_MAGIC {
            return Err("no record");
        }
        if crc32fast::hash(&slot[..end - 4]).to_le_bytes() != slot[end - 4..end] {
            return Err("a corrupt record header");
        }
        let word = |at: usize| u32::from_le_bytes(slot[at..at + 4].try_into().expect("4 bytes"));
        if slot[8..16] != self.fingerprint.to_le_bytes() || word(52) as usize != self.page_size {
            return Err("a record of another model or layout");
        }
        let record = PageRecord {
            hash: PageHash(slot[16..32].try_into().expect("16 bytes")),
            parent: PageHash(slot[32..48].try_into().expect("16 bytes")),
            depth: word(48),
            tokens: (0..self.page_size).map(|i| word(RECORD_FIXED + 4 * i)).collect(),
        };
        Ok((record, word(56)))
    }

    /// The payload of a whole slot whose record is `expected`: None when the slot holds another
    /// page or its bytes do not match their CRC.
    pub fn payload<'s>(&self, slot: &'s [u8], expected: &PageRecord) -> Option<&'s [u8]> {
        let (record, crc) = self.decode_header(slot).ok()?;
        let payload = slot.get(self.payload_offset()..self.payload_offset() + self.payload_bytes)?;
        (record == *expected && crc32fast::hash(payload) == crc).then_some(payload)
    }
}

/// One page's identity in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PageRecord {
    pub hash: PageHash,
    /// The page before it in its sequence (the namespace's root hash for the first page).
    pub parent: PageHash,
    /// Its index in its sequence.
    pub depth: u32,
    pub tokens: Vec<u32>,
}

impl PageRecord {
    /// Page `p` of the chain `hashes` of `namespace` (see [`page_hashes`]), holding `tokens`.
    pub fn in_chain(namespace: u64, hashes: &[PageHash], p: usize, tokens: &[u32]) -> PageRecord {
        let parent = p.checked_sub(1).map_or_else(|| PageHash::root(namespace), |before| hashes[before]);
        PageRecord { hash: hashes[p], parent, depth: p as u32, tokens: tokens.to_vec() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout { fingerprint: 7, page_size: 4, payload_bytes: 5000 }
    }

    fn record() -> PageRecord {
        PageRecord::in_chain(3, &page_hashes(3, &[1, 2, 3, 4, 5, 6, 7, 8], 4), 1, &[5, 6, 7, 8])
    }

    #[test]
    fn hashes_chain_over_namespace_and_every_earlier_token() {
        let a = page_hashes(0, &[1, 2, 3, 4, 5, 6], 2);
        assert_eq!(a.len(), 3);
        assert_eq!(page_hashes(0, &[1, 2, 3, 4, 5, 6, 7], 2), a, "a partial page has no name");
        assert_ne!(page_hashes(1, &[1, 2, 3, 4, 5, 6], 2)[0], a[0], "namespaces never share");
        assert_ne!(page_hashes(0, &[9, 2, 3, 4, 5, 6], 2)[2], a[2], "a page's name covers every earlier token");
        assert_eq!(a[1], PageHash::root(0).next(&[1, 2]).next(&[3, 4]));
    }

    #[test]
    fn a_slot_round_trips_and_any_flipped_byte_is_caught() {
        let layout = layout();
        assert_eq!(layout.slot_bytes(), 3 * ALIGN);
        let payload: Vec<u8> = (0..5000).map(|i| (i * 7 % 251) as u8).collect();
        let slot = layout.encode(&record(), |out| out.copy_from_slice(&payload));
        assert_eq!(slot.len(), layout.slot_bytes());
        assert_eq!(layout.payload(&slot, &record()), Some(&payload[..]));
        for at in [0, 9, 20, 40, 50, 60, layout.header_bytes() - 1, ALIGN, ALIGN + 4999] {
            let mut bad = slot.clone();
            bad[at] ^= 1;
            assert_eq!(layout.payload(&bad, &record()), None, "byte {at} flipped");
        }
        assert_eq!(layout.payload(&slot[..ALIGN + 100], &record()), None, "truncated");
        let other = PageRecord { tokens: vec![5, 6, 7, 9], ..record() };
        assert_eq!(layout.payload(&slot, &other), None, "another page's record");
        let other_model = Layout { fingerprint: 8, ..layout };
        assert_eq!(other_model.decode_header(&slot).err(), Some("a record of another model or layout"));
    }

    #[test]
    fn file_headers_name_their_model_and_layout() {
        let layout = layout();
        assert_eq!(layout.check_file_header(&layout.file_header()), Ok(()));
        let other = Layout { fingerprint: 9, ..layout };
        assert_eq!(layout.check_file_header(&other.file_header()), Err("it was written for another model or other settings"));
        let wider = Layout { payload_bytes: 6000, ..layout };
        assert_eq!(layout.check_file_header(&wider.file_header()), Err("its page layout differs"));
        let mut corrupt = layout.file_header();
        corrupt[20] ^= 1;
        assert_eq!(layout.check_file_header(&corrupt), Err("its header is corrupt"));
        assert_eq!(layout.check_file_header(&[0; 100]), Err("not an rsgl KV cache file"));
    }
}
