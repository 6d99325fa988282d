//! The software rate limiter paces a stream at the configured rate, within 1 % (the issue's
//! requirement), sending over loopback. What the limiter controls is when each burst may
//! start, so that is what is measured: the UDP sender is wrapped in a transport that notes
//! when the stream hands it each burst, and how many bytes. Two checks, neither at the mercy
//! of the scheduler:
//!
//! - **Never ahead of the rate.** Every burst starts no earlier than `t0 + (bytes before it) /
//!   rate`, `t0` read before the first call: the limiter's nominal schedule starts at its
//!   first reservation and only ever moves later (idle restarts, the catch-up bound), so this
//!   holds exactly whatever the timing.
//! - **Not slower than the rate.** The median gap between bursts is the previous burst's
//!   bytes over the rate, within 1 %. A gap after which the sender was late (woken late from
//!   its sleep, or descheduled between calls: common on a loaded 2-core machine) is longer,
//!   and the next bursts catch up at up to `burst_rate_ratio` times the rate (or, after more
//!   than a burst's time, not at all: `spead::send::rate`, idle is not credit). Those gaps
//!   are the scheduler's and a minority (a quarter at most with two busy loops on both
//!   cores), so the median is the limiter's own pacing.
//!
//! It used to time the whole run at a receiver (first to last packet, bytes received), which
//! measured the scheduler: the receiving thread's wake-ups, packets the receive buffer
//! dropped while it slept, and above all the sender's lateness, which the limiter does not
//! make up once it is longer than a burst. Under the full suite it read 1.1 % low; with two
//! busy loops, 1.5 to 20 % low, while the median gap stayed within 0.03 % of the schedule.

use std::io;
use std::net::UdpSocket;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cbf::net::udp::UdpSender;
use cbf::net::{PacketSender, SendBatch};
use cbf::spead::send::{Heap, HeapRef, SendMode, SendStream, SendStreamConfig};

/// When each burst reached the transport, and its bytes.
type Log = Arc<Mutex<Vec<(Instant, usize)>>>;

/// A UDP sender that logs each burst as the stream hands it over (after any pacing wait).
struct Logged {
    inner: UdpSender,
    log: Log,
}

impl PacketSender for Logged {
    fn destinations(&self) -> usize {
        self.inner.destinations()
    }

    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        let now = Instant::now();
        self.log.lock().unwrap().push((now, batch.bytes()));
        self.inner.send_batch(batch)
    }
}

#[test]
fn paced_stream_holds_rate_within_one_percent() {
    // Nobody reads it: the kernel drops what overflows its buffer, and no error comes back.
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dest = match rx.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    let rate = 50e6; // bytes/s: modest, so a debug build on 2 shared cores keeps up
    let heap_bytes = 64 * 1024;
    let n_heaps = (1.2 * rate / heap_bytes as f64) as usize;
    let log = Log::default();
    let tx = Logged {
        inner: UdpSender::new(&[dest], None, 1, 4 << 20).unwrap(),
        log: Arc::clone(&log),
    };
    let cfg = SendStreamConfig {
        max_packet_size: 8192 + 72,
        rate,
        burst_size: 65536,
        ..Default::default()
    };
    let mut s = SendStream::new(cfg, vec![tx]).unwrap();
    let data = vec![7u8; heap_bytes];
    let mut heap = Heap::new();
    heap.add_immediate(0x1600, 0).add_bytes(0x4300, &data[..]);
    let t0 = Instant::now();
    for _ in 0..n_heaps {
        s.send_heaps(&[HeapRef::new(&heap, 0)], SendMode::Serial)
            .unwrap();
    }
    drop(s);
    let bursts = std::mem::take(&mut *log.lock().unwrap());
    // Each heap is one burst (8 packets ≥ 64 KiB), so about 900 gaps.
    assert!(bursts.len() >= n_heaps, "{} bursts", bursts.len());
    let due = |bytes: usize| Duration::from_secs_f64(bytes as f64 / rate);

    // Never ahead. The limiter adds each burst's duration, rounded to the nanosecond, to its
    // schedule: under a microsecond over the run.
    let mut before = 0;
    for (k, &(t, bytes)) in bursts.iter().enumerate() {
        let at = t0 + due(before);
        assert!(
            t + Duration::from_micros(1) >= at,
            "burst {k} {:?} ahead of the rate",
            at - t
        );
        before += bytes;
    }

    // Not slower: each gap over the previous burst's time at the rate.
    let mut ratios: Vec<f64> = bursts
        .windows(2)
        .map(|w| (w[1].0 - w[0].0).as_secs_f64() / due(w[0].1).as_secs_f64())
        .collect();
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    let (first, last) = (bursts[0], bursts[bursts.len() - 1]);
    let overall = (before - last.1) as f64 / (last.0 - first.0).as_secs_f64();
    assert!(
        (median - 1.0).abs() < 0.01,
        "median gap {median:.4} of the schedule's (deciles {:.4} … {:.4}); \
         {overall:.0} B/s over the run for {rate:.0} B/s",
        ratios[ratios.len() / 10],
        ratios[ratios.len() * 9 / 10]
    );
}
