//! The dsim signal language (katgpucbf `dsim/signal.py`, facts §1.5), parsed and evaluated.
//!
//! ```text
//! program   := (statement ";")*            one expression statement per polarisation
//! statement := NAME "=" expr | expr
//! expr      := term (("+" | "-") term)*
//! term      := unary ("*" unary)*
//! unary     := "-" unary | atom
//! atom      := NUMBER | NAME | "(" expr ")" | NAME "(" args ")"
//! ```
//! Generators: `cw(a, f)` a·cos(2πft); `comb(a, f)` impulses of height a at rate f;
//! `multicw(n, a0, da, f0, df)` Σ cw(a0 + i·da, f0 + i·df); `wgn(std[, seed])` white Gaussian
//! noise; `delay(sig, n)` sig delayed by n samples; `nodither(sig)` (outermost only) turns the
//! LSB dither off for that polarisation. Generator arguments are constant expressions.
//!
//! The signal is a pattern of `period` samples replayed forever (as katgpucbf replays its
//! window), so frequencies are rounded to whole cycles per period, a multiple of
//! `adc_sample_rate / period`. Every generator is a pure function of the sample index, so a
//! pattern is reproducible from its canonical text ([`Signal`]'s `Display`, which writes the
//! noise seeds and the rounded frequencies out explicitly).
//!
//! The text comes from outside (`--signals`, and `?signals` from any katcp client), so the
//! work it can ask for is bounded (issue 11), each bound checked while parsing:
//! nesting depth [`MAX_DEPTH`] (parser and evaluator recurse), the size of each signal after
//! variables are expanded [`MAX_NODES`] (variables are shared `Arc` subtrees, never copied, so
//! `a=a+a;` repeated costs memory linear in the text while its expanded size is still counted),
//! tones per `multicw` [`MAX_MULTICW`], and `delay` within [`MAX_DELAY`] samples. The render
//! cost of a pattern, nodes × samples, is bounded by [`check_render_cost`] against
//! [`MAX_RENDER_COST`]; the caller knows the period and must call it before rendering.
#![deny(unsafe_code)]

use std::f64::consts::TAU;
use std::fmt;
use std::sync::Arc;

pub use super::signal_parse::parse;
use crate::dsp::random::{mix, unit};

/// Deepest nesting of parentheses, unary minus, calls and operators, before and after
/// variables are expanded: the parser, the evaluator and `Drop` recurse this deep.
pub const MAX_DEPTH: usize = 128;
/// Most nodes in one signal with every variable expanded (a `multicw` counts its tones).
pub const MAX_NODES: u64 = 4096;
/// Most tones in one `multicw`.
pub const MAX_MULTICW: u64 = 4096;
/// Largest `delay` in samples, either sign (2^53: every such integer is exact in an f64).
pub const MAX_DELAY: f64 = 9_007_199_254_740_992.0;
/// Most node evaluations one render may cost: expanded nodes × samples in the period, summed
/// over polarisations. 2^34 is 128 nodes per polarisation for two polarisations of the
/// largest default period (2^27 samples), about a minute of one core.
pub const MAX_RENDER_COST: u128 = 1 << 34;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SignalError {
    #[error("--signals: {0} at position {1}")]
    Syntax(String, usize),
    #[error("--signals: unknown name {0:?}")]
    Unknown(String),
    #[error("--signals: {0}() takes {1} arguments, got {2}")]
    Arity(String, &'static str, usize),
    #[error("--signals: arguments of {0}() must be constants")]
    NotConstant(String),
    #[error("--signals: {0}")]
    Value(String),
    #[error("--signals: {got} signal(s) given for {want} polarisation(s)")]
    Count { got: usize, want: usize },
    #[error("--signals: {what} exceeds the limit of {limit}")]
    Limit { what: &'static str, limit: u128 },
}

pub(super) fn limit(what: &'static str, limit: impl Into<u128>) -> SignalError {
    SignalError::Limit {
        what,
        limit: limit.into(),
    }
}

/// A signal expression. Subtrees are shared (`Arc`): a variable used twice is one subtree.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Const(f64),
    Cw {
        amplitude: f64,
        frequency: f64,
    },
    Comb {
        amplitude: f64,
        frequency: f64,
    },
    /// Σ_{i<count} cw(amplitude + i·amplitude_step, frequency + i·frequency_step): one node,
    /// so that many tones do not nest `count` deep.
    MultiCw {
        count: u64,
        amplitude: f64,
        amplitude_step: f64,
        frequency: f64,
        frequency_step: f64,
    },
    Wgn {
        std: f64,
        seed: u64,
    },
    Delay(Arc<Expr>, i64),
    Add(Arc<Expr>, Arc<Expr>),
    Sub(Arc<Expr>, Arc<Expr>),
    Mul(Arc<Expr>, Arc<Expr>),
    Neg(Arc<Expr>),
}

/// One polarisation's signal.
#[derive(Debug, Clone, PartialEq)]
pub struct Signal {
    pub expr: Expr,
    pub dither: bool,
}

/// What rendering `signals` over `period` samples costs: expanded nodes × samples, summed.
pub fn render_cost(signals: &[Signal], period: u64) -> u128 {
    signals
        .iter()
        .map(|s| u128::from(s.expr.nodes()) * u128::from(period))
        .sum()
}

/// Refuse a render that would cost more than [`MAX_RENDER_COST`] (call before rendering a
/// pattern from outside text: the period is the caller's).
pub fn check_render_cost(signals: &[Signal], period: u64) -> Result<(), SignalError> {
    if render_cost(signals, period) > MAX_RENDER_COST {
        return Err(limit("render cost (nodes × samples)", MAX_RENDER_COST));
    }
    Ok(())
}

/// Round a frequency to whole cycles per period: returns cycles per period.
pub fn cycles_per_period(frequency: f64, period: u64, adc_sample_rate: f64) -> i64 {
    (frequency * period as f64 / adc_sample_rate).round() as i64
}

/// Evaluation context: the pattern length and the ADC rate that turn Hz into cycles.
#[derive(Debug, Clone, Copy)]
pub struct Timebase {
    pub period: u64,
    pub adc_sample_rate: f64,
}

impl Expr {
    /// Expanded nodes (shared subtrees counted at every use, a `multicw` as its tones): the
    /// evaluation cost per sample. Stops counting past [`MAX_NODES`], so a hand-built graph
    /// with enormous sharing cannot make this exponential.
    pub fn nodes(&self) -> u64 {
        let mut budget = MAX_NODES + 1;
        self.count_nodes(&mut budget);
        MAX_NODES + 1 - budget
    }

    fn count_nodes(&self, budget: &mut u64) {
        if *budget == 0 {
            return;
        }
        let own = match self {
            Expr::MultiCw { count, .. } => *count,
            _ => 1,
        };
        *budget = budget.saturating_sub(own);
        match self {
            Expr::Delay(a, _) | Expr::Neg(a) => a.count_nodes(budget),
            Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) => {
                a.count_nodes(budget);
                b.count_nodes(budget);
            }
            _ => {}
        }
    }

    /// Fill `out[i]` with the value at sample `(t0 + i) mod period`.
    pub fn eval(&self, tb: Timebase, t0: u64, out: &mut [f64]) {
        // A zero period is a caller's error; treat it as one sample rather than divide by 0.
        let p = tb.period.max(1);
        let t0 = t0 % p;
        let at = |i: usize| ((u128::from(t0) + i as u128) % u128::from(p)) as u64;
        match self {
            Expr::Const(v) => out.fill(*v),
            Expr::Cw {
                amplitude,
                frequency,
            } => {
                out.fill(0.0);
                add_cw(out, *amplitude, *frequency, tb, t0);
            }
            Expr::MultiCw {
                count,
                amplitude,
                amplitude_step,
                frequency,
                frequency_step,
            } => {
                out.fill(0.0);
                for i in 0..*count {
                    let a = amplitude + i as f64 * amplitude_step;
                    let f = frequency + i as f64 * frequency_step;
                    add_cw(out, a, f, tb, t0);
                }
            }
            Expr::Comb {
                amplitude,
                frequency,
            } => {
                let k = cycles_per_period(*frequency, p, tb.adc_sample_rate).unsigned_abs() as u128;
                for (i, o) in out.iter_mut().enumerate() {
                    let hit = (k * u128::from(at(i)) % u128::from(p)) < k;
                    *o = if hit { *amplitude } else { 0.0 };
                }
            }
            Expr::Wgn { std, seed } => {
                for (i, o) in out.iter_mut().enumerate() {
                    // Box–Muller on two independent uniforms; 1 − u avoids ln(0).
                    let t = at(i);
                    let u1 = 1.0 - unit(mix(*seed, 1, t));
                    let u2 = unit(mix(*seed, 2, t));
                    *o = std * (-2.0 * u1.ln()).sqrt() * (TAU * u2).cos();
                }
            }
            Expr::Delay(e, n) => {
                // Sample t of the delayed signal is sample t − n of `e`, modulo the period.
                let shift = (-i128::from(*n)).rem_euclid(i128::from(p)) as u128;
                let start = (u128::from(t0) + shift) % u128::from(p);
                e.eval(tb, start as u64, out);
            }
            Expr::Neg(a) => {
                a.eval(tb, t0, out);
                out.iter_mut().for_each(|v| *v = -*v);
            }
            Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) => {
                a.eval(tb, t0, out);
                let mut tmp = vec![0.0; out.len()];
                b.eval(tb, t0, &mut tmp);
                for (o, t) in out.iter_mut().zip(&tmp) {
                    *o = match self {
                        Expr::Add(..) => *o + t,
                        Expr::Sub(..) => *o - t,
                        _ => *o * t,
                    };
                }
            }
        }
    }
}

/// `out[i] += amplitude · cos(2π k (t0 + i) / p)`, k the frequency in whole cycles per period.
fn add_cw(out: &mut [f64], amplitude: f64, frequency: f64, tb: Timebase, t0: u64) {
    let p = tb.period.max(1);
    let k = i128::from(cycles_per_period(frequency, p, tb.adc_sample_rate))
        .rem_euclid(i128::from(p)) as u128;
    for (i, o) in out.iter_mut().enumerate() {
        let t = (u128::from(t0) + i as u128) % u128::from(p);
        let phase = (k * t % u128::from(p)) as f64 / p as f64;
        *o += amplitude * (TAU * phase).cos();
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Const(v) => write!(f, "{v:?}"),
            Expr::Cw {
                amplitude,
                frequency,
            } => write!(f, "cw({amplitude:?}, {frequency:?})"),
            Expr::Comb {
                amplitude,
                frequency,
            } => write!(f, "comb({amplitude:?}, {frequency:?})"),
            Expr::MultiCw {
                count,
                amplitude,
                amplitude_step,
                frequency,
                frequency_step,
            } => write!(
                f,
                "multicw({count}, {amplitude:?}, {amplitude_step:?}, {frequency:?}, {frequency_step:?})"
            ),
            Expr::Wgn { std, seed } => write!(f, "wgn({std:?}, {seed})"),
            Expr::Delay(e, n) => write!(f, "delay({e}, {n})"),
            Expr::Add(a, b) => write!(f, "({a} + {b})"),
            Expr::Sub(a, b) => write!(f, "({a} - {b})"),
            Expr::Mul(a, b) => write!(f, "({a} * {b})"),
            Expr::Neg(a) => write!(f, "-{a}"),
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dither {
            write!(f, "{};", self.expr)
        } else {
            write!(f, "nodither({});", self.expr)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str, pols: usize) -> Result<Vec<Signal>, SignalError> {
        let mut n = 100;
        parse(text, pols, &mut || {
            n += 1;
            n
        })
    }

    #[test]
    fn parses_the_default_and_variables() {
        let s = p("cw(1.0, 232101234.0);", 2).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            s[0].expr,
            Expr::Cw {
                amplitude: 1.0,
                frequency: 232101234.0
            }
        );
        let s = p(
            "x = wgn(0.1); nodither(x + cw(0.2, 1e6)); delay(x, 3) * 2;",
            2,
        )
        .unwrap();
        assert!(!s[0].dither && s[1].dither);
        assert_eq!(
            s[1].expr,
            Expr::Mul(
                Arc::new(Expr::Delay(
                    Arc::new(Expr::Wgn {
                        std: 0.1,
                        seed: 101
                    }),
                    3
                )),
                Arc::new(Expr::Const(2.0))
            )
        );
        // The variable's seed is drawn once: both uses are the same noise.
        assert_eq!(
            s[0].to_string(),
            "nodither((wgn(0.1, 101) + cw(0.2, 1000000.0)));"
        );
        let again = p(&format!("{}{}", s[0], s[1]), 2).unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn errors_are_specific() {
        assert!(matches!(p("cw(1);", 1), Err(SignalError::Arity(..))));
        assert!(matches!(p("foo(1);", 1), Err(SignalError::Unknown(_))));
        assert!(matches!(p("cw(1, 2)", 1), Err(SignalError::Syntax(..))));
        assert!(matches!(
            p("cw(wgn(1), 2);", 1),
            Err(SignalError::NotConstant(_))
        ));
        assert!(matches!(
            p("1; 2; 3;", 2),
            Err(SignalError::Count { got: 3, want: 2 })
        ));
        assert!(matches!(p("1 $ 2;", 1), Err(SignalError::Syntax(..))));
        assert!(matches!(p("y;", 1), Err(SignalError::Unknown(_))));
    }

    #[test]
    fn cw_is_a_periodic_cosine() {
        let tb = Timebase {
            period: 1024,
            adc_sample_rate: 1024.0,
        };
        let e = Expr::Cw {
            amplitude: 0.5,
            frequency: 3.2,
        }; // rounds to 3 cycles per period
        let mut v = vec![0.0; 2048];
        e.eval(tb, 0, &mut v);
        for (t, x) in v.iter().enumerate() {
            let want = 0.5 * (TAU * 3.0 * t as f64 / 1024.0).cos();
            assert!((x - want).abs() < 1e-12);
        }
        let mut d = vec![0.0; 16];
        Expr::Delay(Arc::new(e.clone()), 5).eval(tb, 100, &mut d);
        assert!((d[0] - v[95]).abs() < 1e-12);
    }

    #[test]
    fn noise_has_the_requested_moments() {
        let tb = Timebase {
            period: 1 << 20,
            adc_sample_rate: 1.0,
        };
        let mut v = vec![0.0; 1 << 18];
        Expr::Wgn { std: 0.25, seed: 7 }.eval(tb, 0, &mut v);
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        // Standard errors: 0.25/sqrt(n) ≈ 5e-4 for the mean, ~0.3 % for the variance.
        assert!(mean.abs() < 3e-3, "{mean}");
        assert!((var.sqrt() - 0.25).abs() < 0.25 * 0.01, "{}", var.sqrt());
    }

    #[test]
    fn comb_has_k_impulses_per_period() {
        let tb = Timebase {
            period: 1000,
            adc_sample_rate: 1000.0,
        };
        let mut v = vec![0.0; 1000];
        Expr::Comb {
            amplitude: 1.0,
            frequency: 10.0,
        }
        .eval(tb, 0, &mut v);
        let hits: Vec<usize> = (0..1000).filter(|&i| v[i] != 0.0).collect();
        assert_eq!(hits, (0..10).map(|i| i * 100).collect::<Vec<_>>());
    }

    fn limited(r: Result<Vec<Signal>, SignalError>) -> bool {
        matches!(r, Err(SignalError::Limit { .. }))
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        // Each of these overflowed the parser's or evaluator's stack before the depth limit.
        let n = 200_000;
        assert!(limited(p(
            &format!("{}1{};", "(".repeat(n), ")".repeat(n)),
            1
        )));
        assert!(limited(p(&format!("{}1;", "-".repeat(n)), 1)));
        assert!(limited(p(
            &format!("{}1{};", "delay(".repeat(n), ", 1)".repeat(n)),
            1
        )));
        // A flat chain nests one level per operator in the tree the evaluator walks.
        assert!(limited(p(&format!("1{};", "+1".repeat(n)), 1)));
        // Depth reached through variables counts too.
        let chain: String = (0..MAX_DEPTH + 1).map(|_| "x = delay(x, 1);").collect();
        assert!(limited(p(&format!("x = cw(1, 1);{chain}x;"), 1)));
        // Up to the limit is accepted.
        let ok = format!(
            "{}1{};",
            "(".repeat(MAX_DEPTH - 1),
            ")".repeat(MAX_DEPTH - 1)
        );
        assert!(p(&ok, 1).is_ok());
    }

    #[test]
    fn doubling_a_variable_is_refused_at_the_node_limit() {
        // 2^k nodes from 15·k bytes of text: with copied subtrees this grew memory without
        // bound; shared subtrees keep it linear and the expanded count refuses it.
        let text = format!("a = cw(1, 1);{}a;", "a = a + a;".repeat(64));
        assert!(limited(p(&text, 1)));
        // Just under the limit (2^11 leaves + 2^11 − 1 adds = 4095 nodes) is fine and shared.
        let text = format!("a = cw(1, 1);{}a;", "a = a + a;".repeat(11));
        let s = p(&text, 1).unwrap();
        assert_eq!(s[0].expr.nodes(), 4095);
        assert!(limited(p(
            &format!("a = cw(1, 1);{}a;", "a = a + a;".repeat(12)),
            1
        )));
    }

    #[test]
    fn multicw_and_delay_are_bounded() {
        assert!(limited(p("multicw(1e12, 1, 0, 1, 1);", 1)));
        assert!(limited(p(
            &format!("multicw({}, 1, 0, 1, 1);", MAX_MULTICW + 1),
            1
        )));
        assert!(p(&format!("multicw({MAX_MULTICW}, 1, 0, 1, 1);"), 1).is_ok());
        assert!(limited(p("delay(cw(1, 1), -1e300);", 1)));
        assert!(limited(p("delay(cw(1, 1), 1e19);", 1)));
        // The extreme accepted delay evaluates without overflow.
        let s = p("delay(cw(1, 1), -9007199254740992);", 1).unwrap();
        let tb = Timebase {
            period: u64::MAX,
            adc_sample_rate: 1.0,
        };
        let mut v = [0.0; 4];
        s[0].expr.eval(tb, u64::MAX - 1, &mut v);
        assert!(v.iter().all(|x| x.is_finite()));
    }

    /// Canonical text parses back to the same signal at the depth limit too: generators print
    /// as calls, and a negative argument as a negation, both deeper than a leaf.
    #[test]
    fn canonical_text_of_deep_signals_parses_back() {
        let found_by_fuzzing = "a = cw(0, 1); a = a + a; a = a + a; fa = cw(0, 1); a = a +"
            .to_string()
            + &"-".repeat(114)
            + "a; a = a + a; a = a * a; a;a = a *"
            + &"-".repeat(34)
            + "0"
            + &"-".repeat(15)
            + "5"
            + &"-".repeat(9)
            + "0"
            + &"-".repeat(5)
            + "5"
            + &"-".repeat(8)
            + "a; a;";
        // n negations built through a variable: the text stays shallow, the signal does not.
        let deep = |inner: &str, n: usize| format!("a = {inner}; {} a;", "a = -a; ".repeat(n));
        let mut texts = vec![found_by_fuzzing];
        // The deepest accepted nesting over each kind of leaf: its canonical text must parse.
        for inner in [
            "cw(-1, -2)",
            "cw(1, 2)",
            "delay(cw(1, 2), -3)",
            "wgn(-0.0, 4)",
            "7",
        ] {
            let deepest = (100..=MAX_DEPTH)
                .filter(|&n| p(&deep(inner, n), 1).is_ok())
                .max()
                .unwrap_or_else(|| panic!("{inner} refused at every depth"));
            texts.push(deep(inner, deepest));
        }
        for text in &texts {
            let Ok(s) = p(text, 1) else { continue };
            let canonical = s[0].to_string();
            assert_eq!(p(&canonical, 1), Ok(s.clone()), "{text:?} → {canonical:?}");
        }
    }

    #[test]
    fn render_cost_is_checked() {
        let big = p("multicw(4096, 0.001, 0, 1e6, 1e3);", 2).unwrap();
        assert!(matches!(
            check_render_cost(&big, 1 << 27),
            Err(SignalError::Limit { .. })
        ));
        let default = p("cw(1.0, 232101234.0);", 2).unwrap();
        assert_eq!(render_cost(&default, 1 << 27), 2 << 27);
        assert!(check_render_cost(&default, 1 << 27).is_ok());
    }

    #[test]
    fn multicw_is_the_sum_of_its_tones() {
        let s = p("multicw(3, 0.5, 0.25, 2, 3);", 1).unwrap();
        assert_eq!(s[0].to_string(), "multicw(3, 0.5, 0.25, 2.0, 3.0);");
        assert_eq!(p(&s[0].to_string(), 1).unwrap(), s);
        let tb = Timebase {
            period: 64,
            adc_sample_rate: 64.0,
        };
        let mut v = vec![0.0; 64];
        s[0].expr.eval(tb, 0, &mut v);
        for (t, x) in v.iter().enumerate() {
            let want: f64 = (0..3)
                .map(|i| {
                    let (a, k) = (0.5 + 0.25 * i as f64, 2.0 + 3.0 * i as f64);
                    a * (TAU * k * t as f64 / 64.0).cos()
                })
                .sum();
            assert!((x - want).abs() < 1e-12, "{t}: {x} vs {want}");
        }
    }
}
