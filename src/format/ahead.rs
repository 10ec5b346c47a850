//! Chain links checked ahead of a scan, by other threads.
//!
//! Checking a link is the costliest step of a scan (a blake3 of the whole body),
//! and the only one that seems to need the record before: `link_n = blake3(link_{n-1}
//! ‖ body_n …)`. But every record *stores* its link, so whether record `n` follows
//! from the link record `n − 1` stores can be computed for all records at once, in
//! any order. A scan that meets record `n` with exactly that stored link as its
//! cursor (the only way it gets there: its cursor takes each record's stored link)
//! may take the answer computed ahead instead of computing it again.
//!
//! The answer is a cache, never a judgement: the scan uses it only where the frame
//! starts and ends where it was computed and its cursor holds the same link; a
//! "does not follow" is computed again by the scan itself before it reports damage.
//! Threads are the caller's (this module is pure): any number may call
//! [`LinksAhead::work`] while one scan calls [`LinksAhead::follows`].

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

use super::frame::{BODY_FIXED_BYTES, ChainLink, FRAME_HEADER_BYTES, RecordRef, chain_link_of_body, stored_link};

/// Frames checked per claim.
const BLOCK_FRAMES: usize = 1024;

const FREE: u8 = 0;
const TAKEN: u8 = 1;
const DONE: u8 = 2;

/// How many times a scan looks at a block a worker is checking (helping with later
/// blocks, or yielding, in between) before it checks its frame itself.
const WAIT_LOOKS_MAX: u32 = 100_000;

const UNKNOWN: u8 = 0;
const FOLLOWS: u8 = 1;
const BREAKS: u8 = 2;

/// Links of the frames in a buffer, checked by whoever calls [`Self::work`].
pub struct LinksAhead<'a> {
    buf: &'a [u8],
    /// Start and length (header included) of each frame, as the length fields say.
    frames: Vec<(u32, u32)>,
    /// The link before the first frame.
    first_prev: ChainLink,
    blocks: Vec<AtomicU8>,
    verdicts: Vec<AtomicU8>,
    next_block: AtomicUsize,
    stop: AtomicBool,
}

impl<'a> LinksAhead<'a> {
    /// The frames of `buf` from `start` on, found by their length fields alone (no
    /// checksum: the scan checks each frame whole; a frame found here that is not
    /// one is simply never asked about). Stops at the first length that is not a
    /// possible frame's. `prev` is the link the first frame must follow from.
    pub fn new(buf: &'a [u8], start: usize, prev: ChainLink, body_max: u32) -> Self {
        let mut frames = Vec::new();
        let mut at = start;
        if buf.len() <= u32::MAX as usize {
            while let Some(head) = buf.get(at..at + FRAME_HEADER_BYTES) {
                let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
                if (len as usize) < BODY_FIXED_BYTES || len > body_max {
                    break;
                }
                let total = FRAME_HEADER_BYTES + len as usize;
                if buf.len() - at < total {
                    break;
                }
                frames.push((at as u32, total as u32));
                at += total;
            }
        }
        let blocks = frames.len().div_ceil(BLOCK_FRAMES);
        LinksAhead {
            buf,
            first_prev: prev,
            blocks: (0..blocks).map(|_| AtomicU8::new(FREE)).collect(),
            verdicts: (0..frames.len()).map(|_| AtomicU8::new(UNKNOWN)).collect(),
            frames,
            next_block: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        }
    }

    /// How many frames were found.
    pub fn frames(&self) -> usize {
        self.frames.len()
    }

    /// Check blocks of links, in order, until none is left or [`Self::stop`].
    pub fn work(&self) {
        while !self.stop.load(Ordering::Relaxed) {
            let b = self.next_block.fetch_add(1, Ordering::Relaxed);
            if b >= self.blocks.len() {
                return;
            }
            self.check_block(b);
        }
    }

    /// Ask workers to stop claiming blocks (the scan ended early).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    fn check_block(&self, b: usize) -> bool {
        if self.blocks[b].compare_exchange(FREE, TAKEN, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return false;
        }
        let end = ((b + 1) * BLOCK_FRAMES).min(self.frames.len());
        for i in b * BLOCK_FRAMES..end {
            let (at, total) = self.frames[i];
            let body = &self.buf[at as usize + FRAME_HEADER_BYTES..(at + total) as usize];
            let follows = chain_link_of_body(&self.prev_of(i), body) == stored_link(body);
            self.verdicts[i].store(if follows { FOLLOWS } else { BREAKS }, Ordering::Relaxed);
        }
        self.blocks[b].store(DONE, Ordering::Release);
        true
    }

    /// The link frame `i` must follow from, as its predecessor stores it.
    fn prev_of(&self, i: usize) -> ChainLink {
        match i.checked_sub(1) {
            None => self.first_prev,
            Some(p) => {
                let (at, total) = self.frames[p];
                stored_link(&self.buf[at as usize + FRAME_HEADER_BYTES..(at + total) as usize])
            }
        }
    }

    /// Does `rec`, a frame the scan decoded at `at` in the same buffer, follow from
    /// `prev`? The answer computed ahead where it applies; otherwise computed here.
    /// `hint` is the scan's place in the frames (start it at 0; scans go forward).
    pub fn follows(&self, hint: &mut usize, at: usize, prev: &ChainLink, rec: &RecordRef<'_>) -> bool {
        while *hint < self.frames.len() && (self.frames[*hint].0 as usize) < at {
            *hint += 1;
        }
        let i = *hint;
        let same_frame = self.frames.get(i).is_some_and(|&(start, total)| {
            start as usize == at && total as usize == FRAME_HEADER_BYTES + rec.body.len()
        });
        if same_frame && self.prev_of(i) == *prev {
            let b = i / BLOCK_FRAMES;
            // A worker checks a block in well under a millisecond; one that has
            // not finished after this many looks is not waited for.
            let mut looks_left = WAIT_LOOKS_MAX;
            while looks_left > 0 {
                looks_left -= 1;
                match self.blocks[b].load(Ordering::Acquire) {
                    DONE => {
                        if self.verdicts[i].load(Ordering::Relaxed) == FOLLOWS {
                            return true;
                        }
                        break; // judged again below, before anyone calls it damage
                    }
                    // Nobody has it: check the block here (workers then skip it).
                    FREE => {
                        self.check_block(b);
                    }
                    // A worker is on it: help with a later block meanwhile.
                    _ => {
                        let later = self.next_block.fetch_add(1, Ordering::Relaxed);
                        if later >= self.blocks.len() || !self.check_block(later) {
                            std::thread::yield_now();
                        }
                    }
                }
            }
        }
        rec.link_follows(prev)
    }
}

#[cfg(test)]
mod tests {
    use super::super::scan::tests::log_of as frames;
    use super::*;
    use crate::format::{GENESIS_LINK, decode_frame};

    fn verdicts(buf: &[u8], workers: usize) -> Vec<bool> {
        let ahead = LinksAhead::new(buf, 0, GENESIS_LINK, 1 << 20);
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| ahead.work());
            }
            let (mut at, mut hint, mut prev, mut out) = (0, 0, GENESIS_LINK, vec![]);
            while at < buf.len() {
                let (rec, used) = decode_frame(&buf[at..], 1 << 20).unwrap();
                out.push(ahead.follows(&mut hint, at, &prev, &rec));
                prev = rec.link;
                at += used;
            }
            out
        })
    }

    #[test]
    fn links_checked_ahead_agree_with_links_checked_in_place() {
        let buf = frames(5000);
        for workers in [0, 1, 3] {
            assert_eq!(verdicts(&buf, workers), vec![true; 5000], "{workers} workers");
        }
    }

    #[test]
    fn a_broken_link_is_reported_whoever_checked_it() {
        let mut buf = frames(3000);
        // Rewrite the stored link of record 2100 (and its checksum, so the frame
        // decodes): it and its successor no longer follow.
        let ahead = LinksAhead::new(&buf, 0, GENESIS_LINK, 1 << 20);
        let (at, total) = ahead.frames[2099];
        drop(ahead);
        let body = at as usize + FRAME_HEADER_BYTES..(at + total) as usize;
        buf[body.start + 32] ^= 1;
        let crc = crc32fast::hash(&buf[body.clone()]);
        buf[at as usize + 4..at as usize + 8].copy_from_slice(&crc.to_le_bytes());
        for workers in [0, 1, 2] {
            let v = verdicts(&buf, workers);
            let broken: Vec<usize> = v.iter().enumerate().filter(|(_, ok)| !**ok).map(|(i, _)| i).collect();
            assert_eq!(broken, vec![2099, 2100], "{workers} workers");
        }
    }

    #[test]
    fn a_scan_whose_cursor_differs_checks_the_link_itself() {
        let buf = frames(10);
        let ahead = LinksAhead::new(&buf, 0, GENESIS_LINK, 1 << 20);
        ahead.work();
        let (rec, _) = decode_frame(&buf, 1 << 20).unwrap();
        let mut hint = 0;
        // The cached verdict was for the genesis link; from another link the first
        // record does not follow.
        assert!(!ahead.follows(&mut hint, 0, &[1; 32], &rec));
        assert!(ahead.follows(&mut hint, 0, &GENESIS_LINK, &rec));
    }

    #[test]
    fn lengths_that_are_not_frames_end_the_walk() {
        let mut buf = frames(4);
        buf.extend_from_slice(&[0xff; 8]);
        assert_eq!(LinksAhead::new(&buf, 0, GENESIS_LINK, 1 << 20).frames(), 4);
        assert_eq!(LinksAhead::new(&buf[..buf.len() - 20], 0, GENESIS_LINK, 1 << 20).frames(), 3);
    }
}
