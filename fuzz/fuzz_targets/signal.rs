//! Fuzz the dsim signal language: any text is parsed for 1 and 2 polarisations; an accepted
//! program has its render cost checked, is evaluated over a short period, and its canonical
//! text must parse again. Nothing may panic, overflow the stack or run away (the limits in
//! `sim::signal` bound every step). Seeds: fuzz/seeds/signal.
#![no_main]

use cbf::sim::signal::{check_render_cost, parse, Timebase};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for pols in [1, 2] {
        let mut seed = 0;
        let Ok(signals) = parse(text, pols, &mut || {
            seed += 1;
            seed
        }) else {
            continue;
        };
        let period = 64;
        if check_render_cost(&signals, period).is_err() {
            continue;
        }
        let tb = Timebase {
            period,
            adc_sample_rate: 64.0,
        };
        let mut out = [0.0; 16];
        for s in &signals {
            s.expr.eval(tb, 60, &mut out);
            let canonical = s.to_string();
            let again = parse(&canonical, 1, &mut || 0);
            assert_eq!(again, Ok(vec![s.clone()]), "{canonical:?}");
        }
    }
});
