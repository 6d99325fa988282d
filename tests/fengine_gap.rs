//! An input gap far longer than the receive window (issue 11): the F-engine crosses it in one
//! step and accounts for every heap of it. A pcap recording holds four chunks, then, 4·10⁹
//! chunks (2.6·10¹⁴ samples, 42 hours at 1712 MHz) later, six more. The engine must finish
//! promptly (walking the gap one output heap at a time, 3·10¹⁰ of them, took minutes), every digitiser heap slot
//! between the first and last chunk must be counted received, missing or dropped far-future,
//! and every output heap slot must be sent or counted skipped.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cbf::net::udp::UdpReceiver;
use cbf::net::{PacketReceiver, Received, RecvBatch};
use cbf::spead::items::TIMESTAMP_ID;
use cbf::spead::recv::{HeapStream, HeapStreamConfig};

/// The number after `key` in `line` (`key[a, b]` gives a + b).
fn field(line: &str, key: &str) -> u64 {
    let at = line
        .find(key)
        .unwrap_or_else(|| panic!("{key:?} in {line}"));
    let rest = &line[at + key.len()..];
    let text = match rest.strip_prefix('[') {
        Some(list) => &list[..list.find(']').unwrap()],
        None => {
            &rest[..rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len())]
        }
    };
    text.split(", ").map(|v| v.parse::<u64>().unwrap()).sum()
}

#[test]
fn a_gap_of_billions_of_chunks_is_crossed_and_counted() {
    let (channels, sph, hs, chunk) = (64u64, 64u64, 4096u64, 65536u64);
    let gap = 4_000_000_000u64;
    let chunks: Vec<u64> = (0..4).chain(gap..gap + 6).collect();
    let per_pol = chunk / hs;
    let path = std::env::temp_dir().join(format!("cbf-gap-{}.pcap", std::process::id()));
    let heaps = chunks.iter().flat_map(|&c| c * per_pol..(c + 1) * per_pol);
    let recorded = common::record_noise(&path, hs, chunk, heaps, |_, _| false);

    let mut rx = UdpReceiver::bind(&["127.0.0.1:0".parse().unwrap()], None, 32 << 20).unwrap();
    let port = rx.local_addr().unwrap().port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cbf"))
        .args([
            "fengine",
            "--src",
            path.to_str().unwrap(),
            "--adc-sample-rate",
            "2e6",
        ])
        .args([
            "--sync-time",
            "0",
            "--katcp-port",
            "0",
            "--katcp-host",
            "127.0.0.1",
        ])
        .args(["--recv-chunk-samples", &chunk.to_string()])
        .args(["--jones-per-batch", &(channels * sph).to_string()])
        .args(["--max-delay-diff", "0", "--send-rate-factor", "0"])
        .args([
            "--wideband",
            &format!("name=wide,channels={channels},dst=127.0.0.1:{port},taps=16"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("the engine is still walking the gap after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    std::fs::remove_file(&path).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let input = stdout.lines().find(|l| l.contains("input chunks")).unwrap();
    let output = stdout.lines().find(|l| l.contains("output wide")).unwrap();

    // Input: every heap slot from the first chunk to the last is accounted for.
    let slots = 2 * per_pol * (chunks[chunks.len() - 1] + 1 - chunks[0]);
    let (missing, far) = (field(input, "missing "), field(input, "far future "));
    assert!(
        far > 0,
        "the jump must have been confirmed by dropped heaps: {input}"
    );
    assert_eq!(missing, slots - recorded + far, "{input}");

    // Output: every heap slot on the output grid up to the end of the last chunk was sent
    // or counted skipped.
    let mut stream = HeapStream::new(HeapStreamConfig::default());
    let mut batch = RecvBatch::new(64, rx.slot_size(9200));
    let mut heaps = Vec::new();
    while let Received::Packets(_) = rx.recv_batch(&mut batch).unwrap() {
        for p in batch.iter() {
            stream.add_packet(p, &mut heaps);
        }
    }
    let span = 2 * channels * sph;
    let out_slots = (gap + 6) * chunk / span;
    // F heaps (the descriptor heap sent at start-up has no timestamp).
    let sent = heaps
        .iter()
        .filter(|h| h.item(TIMESTAMP_ID).is_some())
        .count() as u64;
    assert!(sent >= 8, "heaps on both sides of the gap: {output}");
    assert_eq!(field(output, "sent "), sent, "{output}");
    assert_eq!(sent + field(output, "skipped "), out_slots, "{output}");
}
