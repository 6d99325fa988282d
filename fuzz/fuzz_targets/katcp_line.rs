//! Fuzz katcp request lines through the server's parser and dispatch (`answer_line`) with each
//! engine's own handler (the F-engine's `?gain`, `?gain-all`, `?delays`, `?capture-*`; the
//! XB-engine's `?beam-weights`, `?beam-delays`, `?beam-quant-gains`, `?frb-weights`,
//! `?frb-beams` (a list output and a grid output), `?capture-*`) and the standard requests. The input is split into lines as the server splits
//! them. Every reply must format and parse back to itself. Seeds: fuzz/seeds/katcp_line.
#![no_main]

use std::sync::Arc;

use cbf::control::katcp::{Limits, Message, Sensors, Server, Session};
use cbf::dsp::frb_resample::FrbBeams;
use cbf::fengine::control::{EngineControl, OutputState};
use cbf::xbengine::control::{FrbSetup, OutputNames, XbControl};
use libfuzzer_sys::fuzz_target;
use num_complex::Complex32;

fuzz_target!(|data: &[u8]| {
    let one = Complex32::new(1.0, 0.0);
    let out = OutputState {
        name: "wide".into(),
        channels: 8,
        gains: [vec![one; 8], vec![one; 8]],
        gains_version: 0,
        new_delays: [vec![], vec![]],
        capture: false,
        default_gain: one,
    };
    let sensors = Arc::new(Sensors::default());
    let control = EngineControl::new(vec![out], Arc::clone(&sensors), 1712e6, 1000.0, 1 << 20);
    let xb_sensors = Arc::new(Sensors::default());
    let xb = XbControl::new(
        Arc::clone(&xb_sensors),
        4,
        OutputNames {
            corrprods: vec!["bl".into()],
            beams: vec!["b0".into(), "b1".into()],
        },
        vec![
            // A list re-pointable by `?frb-beams` (its CPU table built by the request) and a
            // grid, which refuses it.
            FrbSetup {
                name: "f0".into(),
                beams: FrbBeams::List(vec![(0.0, 0.0), (1.5, -2.0), (0.25, 7.0)]),
                host_grid: Some((2, 3)),
            },
            FrbSetup {
                name: "f1".into(),
                beams: FrbBeams::even(2, 3, 2, 2),
                host_grid: Some((2, 3)),
            },
        ],
        false,
        (0, 1024),
        1,
    );
    let limits = Limits {
        max_args: 64,
        ..Limits::default()
    };
    let f = Server::new(sensors, Arc::new(control), "fuzz").with_limits(limits);
    let x = Server::new(xb_sensors, Arc::new(xb), "fuzz").with_limits(limits);
    let session = Session::new("fuzz".into());
    for line in data.split(|&c| c == b'\n') {
        let replies = f
            .answer_line(line, &session)
            .into_iter()
            .chain(x.answer_line(line, &session));
        for reply in replies {
            let text = reply.to_line();
            let back = Message::parse(text.trim_end_matches('\n').as_bytes());
            assert_eq!(back.as_ref(), Ok(&reply), "{text:?}");
        }
    }
});
