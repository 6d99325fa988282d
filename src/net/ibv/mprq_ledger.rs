//! The striding receive queue's bookkeeping (issue 15: the payload copied once, into the chunk;
//! seed 000 §Network receive): where each completion's frame lies, and when a receive buffer
//! may go back to the NIC. Pure data, so that the rule is tested without a device.
//!
//! A striding (multi-packet) receive queue gives the NIC buffers of `strides` strides of
//! `stride_len` bytes, one work request each, and the NIC packs frames into them in the order
//! they were posted, each frame starting on a stride boundary. A completion says only how many
//! strides it consumed, how many bytes its frame has, and whether it is a *filler*: the strides
//! left at the end of a buffer too short for the next frame, which carry none. Where a frame
//! lies follows by counting: it starts where the buffer's previous completion ended, and the
//! completion that brings the count to `strides` is the buffer's last (the layout of the byte
//! count word is the mlx5 one, [`StrideCompletion::from_byte_cnt`]; spead2's `udp_ibv` MPRQ
//! reader and DPDK's mlx5 driver count the same way).
//!
//! Each buffer is in one of three states:
//! - *at the NIC*: posted and not yet finished. Frames it already completed may be lent to
//!   receive batches; the NIC writes only the strides after them.
//! - *lent*: finished (its last completion came), with `n > 0` frames still lent.
//! - *free*: finished with nothing lent. It goes back to the NIC at once: onto `to_post`, in
//!   the order buffers become free, and is at the NIC again from then on.
//!
//! So the NIC never writes into a frame that a batch reads (the proptest below checks this
//! against a model of the NIC), and no buffer is lost: every buffer is at the NIC, lent, or on
//! the `to_post` list the receiver posts in the same call.

#![deny(unsafe_code)]

use std::collections::VecDeque;
use std::fmt;

/// Bits of the byte count word of a striding queue's completion (mlx5: bytes in bits 0–15,
/// strides consumed in 16–29, the filler flag in bit 31).
const LEN_MASK: u32 = 0xffff;
const STRIDES_SHIFT: u32 = 16;
const STRIDES_MASK: u32 = 0x3fff;
const FILLER: u32 = 1 << 31;

/// The most strides per buffer that completions can count (a filler reports up to all but one
/// of a buffer's strides in 14 bits): log2 of it, the cap `mprq_verbs::plan` applies.
pub const MAX_STRIDES_LOG: u32 = 14;

/// One completion of a striding queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrideCompletion {
    /// Strides it consumed (≥ 1).
    pub strides: u32,
    /// Bytes of its frame (meaningless for a filler).
    pub len: usize,
    /// The buffer's unused tail, no frame.
    pub filler: bool,
}

impl StrideCompletion {
    /// Decode the byte count word as the NIC writes it into a striding queue's completion
    /// (what `ibv_wc_read_byte_len` returns for one).
    pub fn from_byte_cnt(word: u32) -> StrideCompletion {
        StrideCompletion {
            strides: (word >> STRIDES_SHIFT) & STRIDES_MASK,
            len: (word & LEN_MASK) as usize,
            filler: word & FILLER != 0,
        }
    }
}

/// Where a completion's frame lies: `len` bytes at `offset` in buffer `buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub buffer: usize,
    pub offset: usize,
    pub len: usize,
}

/// A completion or a release that does not fit the protocol of the module doc; the receiver
/// counts and logs them. None comes from a NIC and batches that keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerFault {
    /// A completion while no buffer was at the NIC (skipped).
    NothingPosted,
    /// A completion that consumed no stride (skipped: its frame would overlap the next).
    NoStrides,
    /// A completion that consumed more strides than its buffer had left: the buffer is taken
    /// as finished, and the frame is not lent.
    Overrun,
    /// A buffer given back that had no frame lent (ignored).
    NotLent(usize),
}

impl fmt::Display for LedgerFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerFault::NothingPosted => write!(f, "a completion with no buffer posted"),
            LedgerFault::NoStrides => write!(f, "a completion that consumed no stride"),
            LedgerFault::Overrun => write!(f, "a completion past the end of its buffer"),
            LedgerFault::NotLent(b) => write!(f, "buffer {b} given back with nothing lent"),
        }
    }
}

/// Who holds each buffer of a striding queue (see the module doc).
#[derive(Debug)]
pub struct Ledger {
    strides: u32,
    stride_len: usize,
    /// The buffers at the NIC, in the order it fills them (the order they were posted); the
    /// first is being filled.
    at_nic: VecDeque<usize>,
    /// Strides of the first buffer at the NIC already consumed.
    used: u32,
    /// Frames of each buffer lent to batches.
    lent: Vec<u32>,
    /// Whether each buffer is at the NIC.
    posted: Vec<bool>,
}

impl Ledger {
    /// `buffers` buffers of `strides` (≥ 1) strides of `stride_len` bytes, all at the NIC in
    /// the order 0, 1, …: the receiver posts them so when it opens.
    pub fn new(buffers: usize, strides: u32, stride_len: usize) -> Ledger {
        Ledger {
            strides: strides.max(1),
            stride_len,
            at_nic: (0..buffers).collect(),
            used: 0,
            lent: vec![0; buffers],
            posted: vec![true; buffers],
        }
    }

    pub fn buffers(&self) -> usize {
        self.lent.len()
    }

    /// Place completion `c`: its frame (not a filler's, nor one cut to the strides it
    /// consumed) is offered to `lend`, and stays lent until [`Ledger::release`] when that says
    /// true; if it was its buffer's last and nothing of the buffer is lent, the buffer goes on
    /// `to_post`.
    pub fn complete(
        &mut self,
        c: StrideCompletion,
        lend: impl FnOnce(Frame) -> bool,
        to_post: &mut Vec<usize>,
    ) -> Result<(), LedgerFault> {
        let Some(&buffer) = self.at_nic.front() else {
            return Err(LedgerFault::NothingPosted);
        };
        if c.strides == 0 {
            return Err(LedgerFault::NoStrides);
        }
        let left = self.strides - self.used;
        let overrun = c.strides > left;
        let strides = c.strides.min(left);
        let offset = self.used as usize * self.stride_len;
        self.used += strides;
        if !overrun && !c.filler {
            // A frame never reaches past the strides it consumed: the NIC may write those next.
            let len = c.len.min(strides as usize * self.stride_len);
            if lend(Frame {
                buffer,
                offset,
                len,
            }) {
                self.lent[buffer] += 1;
            }
        }
        if self.used == self.strides {
            self.at_nic.pop_front();
            self.used = 0;
            self.posted[buffer] = false;
            if self.lent[buffer] == 0 {
                self.repost(buffer, to_post);
            }
        }
        if overrun {
            Err(LedgerFault::Overrun)
        } else {
            Ok(())
        }
    }

    /// A batch gave back one frame of `buffer`; the buffer goes on `to_post` if that was its
    /// last frame lent and the NIC has finished it.
    pub fn release(&mut self, buffer: usize, to_post: &mut Vec<usize>) -> Result<(), LedgerFault> {
        match self.lent.get_mut(buffer) {
            Some(n) if *n > 0 => *n -= 1,
            _ => return Err(LedgerFault::NotLent(buffer)),
        }
        if self.lent[buffer] == 0 && !self.posted[buffer] {
            self.repost(buffer, to_post);
        }
        Ok(())
    }

    fn repost(&mut self, buffer: usize, to_post: &mut Vec<usize>) {
        self.posted[buffer] = true;
        self.at_nic.push_back(buffer);
        to_post.push(buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Byte count words written out by hand from the mlx5 layout (bytes 0–15, strides 16–29,
    /// filler 31): a 8242-byte frame over 129 strides of 64 bytes, and a 3-stride filler.
    #[test]
    fn byte_count_words_decode() {
        assert_eq!(
            StrideCompletion::from_byte_cnt(0x0081_2032),
            StrideCompletion {
                strides: 129,
                len: 8242,
                filler: false
            }
        );
        let f = StrideCompletion::from_byte_cnt(0x8003_0000);
        assert_eq!((f.strides, f.filler), (3, true));
        // Bit 30 is not part of the stride count.
        assert_eq!(StrideCompletion::from_byte_cnt(0x4001_0040).strides, 1);
    }

    fn frame(strides: u32, len: usize) -> StrideCompletion {
        StrideCompletion {
            strides,
            len,
            filler: false,
        }
    }

    fn filler(strides: u32) -> StrideCompletion {
        StrideCompletion {
            strides,
            len: 0,
            filler: true,
        }
    }

    /// Two buffers of 4 strides of 64 bytes. Buffer 0 gets a 100-byte frame (2 strides), a
    /// 64-byte one, and a filler; the frames lie at 0 and 128; the buffer goes back only when
    /// both are given back, not when the NIC finishes it. Buffer 1, finished with nothing
    /// lent, goes back at once.
    #[test]
    fn a_buffer_goes_back_when_finished_and_every_frame_is_given_back() {
        let mut l = Ledger::new(2, 4, 64);
        let mut to_post = Vec::new();
        let mut got = Vec::new();
        let mut lend = |f: Frame| {
            got.push(f);
            true
        };
        l.complete(frame(2, 100), &mut lend, &mut to_post).unwrap();
        l.complete(frame(1, 64), &mut lend, &mut to_post).unwrap();
        l.complete(filler(1), |_| panic!("a filler has no frame"), &mut to_post)
            .unwrap();
        assert_eq!(
            got,
            [
                Frame {
                    buffer: 0,
                    offset: 0,
                    len: 100
                },
                Frame {
                    buffer: 0,
                    offset: 128,
                    len: 64
                }
            ]
        );
        assert!(to_post.is_empty(), "finished, but two frames are lent");
        l.release(0, &mut to_post).unwrap();
        assert!(to_post.is_empty(), "one frame still lent");
        l.complete(frame(4, 256), |_| false, &mut to_post).unwrap();
        assert_eq!(to_post, [1], "buffer 1 finished with nothing lent");
        l.release(0, &mut to_post).unwrap();
        assert_eq!(to_post, [1, 0]);
        assert_eq!(l.release(0, &mut to_post), Err(LedgerFault::NotLent(0)));
        assert_eq!(l.release(7, &mut to_post), Err(LedgerFault::NotLent(7)));
        // Buffer 1 was posted again before buffer 0, so the NIC fills it next.
        let mut at = None;
        l.complete(frame(1, 10), |f| at.replace(f).is_none(), &mut to_post)
            .unwrap();
        assert_eq!(at.map(|f| (f.buffer, f.offset)), Some((1, 0)));
    }

    /// A frame longer than the strides it consumed is cut to them; a completion past the
    /// buffer's end finishes the buffer without lending; none with nothing posted or no
    /// strides is placed.
    #[test]
    fn completions_that_break_the_protocol_are_refused() {
        let mut l = Ledger::new(1, 4, 64);
        let mut to_post = Vec::new();
        let mut len = 0;
        l.complete(
            frame(1, 1000),
            |f| {
                len = f.len;
                false
            },
            &mut to_post,
        )
        .unwrap();
        assert_eq!(len, 64);
        assert_eq!(
            l.complete(frame(0, 10), |_| true, &mut to_post),
            Err(LedgerFault::NoStrides)
        );
        assert_eq!(
            l.complete(frame(9, 10), |_| panic!("not lent"), &mut to_post),
            Err(LedgerFault::Overrun)
        );
        assert_eq!(to_post, [0], "taken as finished");
        let mut empty = Ledger::new(0, 4, 64);
        assert_eq!(
            empty.complete(frame(1, 10), |_| true, &mut to_post),
            Err(LedgerFault::NothingPosted)
        );
    }

    /// One step of the NIC-and-batches scenario the proptest plays.
    #[derive(Debug, Clone)]
    enum Step {
        /// A frame of this many bytes arrives; the batch takes it if the flag says so.
        Arrive(usize, bool),
        /// The batches give back their n-th loan (modulo how many there are).
        GiveBack(usize),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![
                3 => (1usize..=300, any::<bool>()).prop_map(|(n, l)| Step::Arrive(n, l)),
                2 => any::<usize>().prop_map(Step::GiveBack),
            ],
            0..400,
        )
    }

    /// A model NIC, written from the hardware's side and sharing nothing with the ledger: it
    /// keeps its own queue of the buffers posted to it, packs each frame at the next stride of
    /// the buffer in front (a filler for the rest when it does not fit, then the next buffer),
    /// drops frames when it has no buffer, and reports completions as raw byte count words.
    struct Nic {
        queue: VecDeque<usize>,
        used: u32,
        strides: u32,
        stride_len: usize,
    }

    impl Nic {
        /// Receive a frame of `len` bytes: the completion words it writes, and where the frame
        /// went (buffer, byte range), or nothing when it had no buffer for it.
        fn arrive(&mut self, len: usize) -> (Vec<u32>, Option<(usize, usize, usize)>) {
            let need = len.div_ceil(self.stride_len) as u32;
            let mut words = Vec::new();
            if self.queue.is_empty() {
                return (words, None);
            }
            if need > self.strides - self.used {
                words.push(FILLER | ((self.strides - self.used) << 16) | 0x1234);
                self.queue.pop_front();
                self.used = 0;
                if self.queue.is_empty() {
                    return (words, None);
                }
            }
            let b = self.queue[0];
            let at = self.used as usize * self.stride_len;
            words.push((need << 16) | len as u32);
            self.used += need;
            if self.used == self.strides {
                self.queue.pop_front();
                self.used = 0;
            }
            (words, Some((b, at, at + len)))
        }
    }

    proptest! {
        /// Against the model NIC, with batches that take or refuse frames and give loans back
        /// in any order: every frame lent is where the NIC wrote it; the NIC never writes into
        /// a frame still lent (so no buffer is posted while a frame in it is lent); a buffer is
        /// posted only after the NIC has finished it (never twice); and once every loan is
        /// back, every buffer is at the NIC again.
        #[test]
        fn the_nic_never_writes_a_lent_frame_and_no_buffer_is_lost(
            buffers in 1usize..6,
            strides_log in 0u32..4,
            script in steps(),
        ) {
            let (strides, stride_len) = (1u32 << strides_log, 64usize);
            let buffer_len = strides as usize * stride_len;
            let mut ledger = Ledger::new(buffers, strides, stride_len);
            let mut nic = Nic { queue: (0..buffers).collect(), used: 0, strides, stride_len };
            let mut loans: Vec<Frame> = Vec::new();
            let mut to_post = Vec::new();
            let post = |to_post: &mut Vec<usize>, nic: &mut Nic, loans: &[Frame]| {
                for b in to_post.drain(..) {
                    assert!(!nic.queue.contains(&b), "buffer {b} posted while the NIC holds it");
                    assert!(loans.iter().all(|f| f.buffer != b), "buffer {b} posted while lent");
                    nic.queue.push_back(b);
                }
            };
            for step in script {
                match step {
                    Step::Arrive(n, take) => {
                        let len = n.min(buffer_len);
                        let (words, wrote) = nic.arrive(len);
                        if let Some((b, start, end)) = wrote {
                            for f in &loans {
                                let overlaps = f.buffer == b && f.offset < end && start < f.offset + f.len;
                                prop_assert!(!overlaps, "the NIC wrote {b}:{start}..{end} over lent {f:?}");
                            }
                        }
                        for w in words {
                            let c = StrideCompletion::from_byte_cnt(w);
                            let mut lent = None;
                            ledger.complete(c, |f| { lent = Some(f); take }, &mut to_post).unwrap();
                            if let Some(f) = lent {
                                let (b, start, end) = wrote.unwrap();
                                prop_assert_eq!((f.buffer, f.offset, f.offset + f.len), (b, start, end));
                                if take {
                                    loans.push(f);
                                }
                            }
                            post(&mut to_post, &mut nic, &loans);
                        }
                    }
                    Step::GiveBack(i) if !loans.is_empty() => {
                        let f = loans.swap_remove(i % loans.len());
                        ledger.release(f.buffer, &mut to_post).unwrap();
                        post(&mut to_post, &mut nic, &loans);
                    }
                    Step::GiveBack(_) => {}
                }
            }
            while let Some(f) = loans.pop() {
                ledger.release(f.buffer, &mut to_post).unwrap();
                post(&mut to_post, &mut nic, &loans);
            }
            let mut held: Vec<usize> = nic.queue.iter().copied().collect();
            held.sort_unstable();
            prop_assert_eq!(held, (0..buffers).collect::<Vec<_>>());
        }
    }
}
