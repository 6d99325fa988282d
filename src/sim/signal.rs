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
#![deny(unsafe_code)]

use std::collections::HashMap;
use std::f64::consts::TAU;
use std::fmt;

use crate::dsp::random::{mix, unit};

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
}

/// A signal expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Const(f64),
    Cw { amplitude: f64, frequency: f64 },
    Comb { amplitude: f64, frequency: f64 },
    Wgn { std: f64, seed: u64 },
    Delay(Box<Expr>, i64),
    Add(Box<Expr>, Box<Expr>),
    Sub(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, Box<Expr>),
    Neg(Box<Expr>),
}

/// One polarisation's signal.
#[derive(Debug, Clone, PartialEq)]
pub struct Signal {
    pub expr: Expr,
    pub dither: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Name(String),
    Sym(char),
}

fn lex(text: &str) -> Result<Vec<(Tok, usize)>, SignalError> {
    let b = text.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i] as char;
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                i += 1;
            }
            if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
                i += 1;
                if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
                    i += 1;
                }
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let v = text[start..i].parse().map_err(|_| {
                SignalError::Syntax(format!("bad number {:?}", &text[start..i]), start)
            })?;
            out.push((Tok::Num(v), start));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push((Tok::Name(text[start..i].to_string()), start));
        } else if "()+-*,;=".contains(c) {
            out.push((Tok::Sym(c), i));
            i += 1;
        } else {
            return Err(SignalError::Syntax(format!("unexpected {c:?}"), i));
        }
    }
    Ok(out)
}

/// Raw parse tree before variables and constants are resolved.
#[derive(Debug, Clone)]
enum Node {
    Num(f64),
    Var(String),
    Call(String, Vec<Node>),
    Bin(char, Box<Node>, Box<Node>),
    Neg(Box<Node>),
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    end: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.0)
    }
    fn at(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |t| t.1)
    }
    fn expect(&mut self, c: char) -> Result<(), SignalError> {
        if self.peek() == Some(&Tok::Sym(c)) {
            self.pos += 1;
            Ok(())
        } else {
            Err(SignalError::Syntax(format!("expected {c:?}"), self.at()))
        }
    }
    fn expr(&mut self) -> Result<Node, SignalError> {
        let mut lhs = self.term()?;
        while let Some(Tok::Sym(c @ ('+' | '-'))) = self.peek().cloned() {
            self.pos += 1;
            lhs = Node::Bin(c, Box::new(lhs), Box::new(self.term()?));
        }
        Ok(lhs)
    }
    fn term(&mut self) -> Result<Node, SignalError> {
        let mut lhs = self.unary()?;
        while self.peek() == Some(&Tok::Sym('*')) {
            self.pos += 1;
            lhs = Node::Bin('*', Box::new(lhs), Box::new(self.unary()?));
        }
        Ok(lhs)
    }
    fn unary(&mut self) -> Result<Node, SignalError> {
        if self.peek() == Some(&Tok::Sym('-')) {
            self.pos += 1;
            return Ok(Node::Neg(Box::new(self.unary()?)));
        }
        self.atom()
    }
    fn atom(&mut self) -> Result<Node, SignalError> {
        let at = self.at();
        match self.toks.get(self.pos).map(|t| t.0.clone()) {
            Some(Tok::Num(v)) => {
                self.pos += 1;
                Ok(Node::Num(v))
            }
            Some(Tok::Sym('(')) => {
                self.pos += 1;
                let e = self.expr()?;
                self.expect(')')?;
                Ok(e)
            }
            Some(Tok::Name(n)) => {
                self.pos += 1;
                if self.peek() != Some(&Tok::Sym('(')) {
                    return Ok(Node::Var(n));
                }
                self.pos += 1;
                let mut args = Vec::new();
                if self.peek() != Some(&Tok::Sym(')')) {
                    loop {
                        args.push(self.expr()?);
                        if self.peek() == Some(&Tok::Sym(',')) {
                            self.pos += 1;
                        } else {
                            break;
                        }
                    }
                }
                self.expect(')')?;
                Ok(Node::Call(n, args))
            }
            _ => Err(SignalError::Syntax("expected a value".into(), at)),
        }
    }
}

/// Resolves names and folds generator arguments; `seeds` supplies seeds for unseeded `wgn`.
struct Resolver<'a> {
    vars: HashMap<String, Signal>,
    seeds: &'a mut dyn FnMut() -> u64,
}

impl Resolver<'_> {
    fn constant(&mut self, name: &str, n: &Node) -> Result<f64, SignalError> {
        let expr = self.resolve(n)?.expr;
        fold(&expr).ok_or_else(|| SignalError::NotConstant(name.into()))
    }

    fn resolve(&mut self, n: &Node) -> Result<Signal, SignalError> {
        let plain = |expr| Ok(Signal { expr, dither: true });
        match n {
            Node::Num(v) => plain(Expr::Const(*v)),
            Node::Var(name) => self
                .vars
                .get(name)
                .cloned()
                .ok_or_else(|| SignalError::Unknown(name.clone())),
            Node::Neg(a) => plain(Expr::Neg(Box::new(self.resolve(a)?.expr))),
            Node::Bin(op, a, b) => {
                let (a, b) = (
                    Box::new(self.resolve(a)?.expr),
                    Box::new(self.resolve(b)?.expr),
                );
                plain(match op {
                    '+' => Expr::Add(a, b),
                    '-' => Expr::Sub(a, b),
                    _ => Expr::Mul(a, b),
                })
            }
            Node::Call(name, args) => {
                let arity = |want: &'static str, ok: bool| {
                    if ok {
                        Ok(())
                    } else {
                        Err(SignalError::Arity(name.clone(), want, args.len()))
                    }
                };
                match name.as_str() {
                    "cw" | "comb" => {
                        arity("2", args.len() == 2)?;
                        let amplitude = self.constant(name, &args[0])?;
                        let frequency = self.constant(name, &args[1])?;
                        plain(if name == "cw" {
                            Expr::Cw {
                                amplitude,
                                frequency,
                            }
                        } else {
                            Expr::Comb {
                                amplitude,
                                frequency,
                            }
                        })
                    }
                    "multicw" => {
                        arity("5", args.len() == 5)?;
                        let v: Vec<f64> = args
                            .iter()
                            .map(|a| self.constant(name, a))
                            .collect::<Result<_, _>>()?;
                        if v[0] < 1.0 || v[0].fract() != 0.0 {
                            return Err(SignalError::Value(
                                "multicw() count must be a positive integer".into(),
                            ));
                        }
                        let mut e = Expr::Cw {
                            amplitude: v[1],
                            frequency: v[3],
                        };
                        for i in 1..v[0] as usize {
                            let cw = Expr::Cw {
                                amplitude: v[1] + i as f64 * v[2],
                                frequency: v[3] + i as f64 * v[4],
                            };
                            e = Expr::Add(Box::new(e), Box::new(cw));
                        }
                        plain(e)
                    }
                    "wgn" => {
                        arity("1 or 2", matches!(args.len(), 1 | 2))?;
                        let std = self.constant(name, &args[0])?;
                        let seed = match args.get(1) {
                            Some(a) => {
                                let s = self.constant(name, a)?;
                                if s < 0.0 || s.fract() != 0.0 {
                                    return Err(SignalError::Value(
                                        "wgn() seed must be a non-negative integer".into(),
                                    ));
                                }
                                s as u64
                            }
                            None => (self.seeds)(),
                        };
                        plain(Expr::Wgn { std, seed })
                    }
                    "delay" => {
                        arity("2", args.len() == 2)?;
                        let sig = self.resolve(&args[0])?;
                        let n = self.constant(name, &args[1])?;
                        if n.fract() != 0.0 {
                            return Err(SignalError::Value(
                                "delay() takes a whole number of samples".into(),
                            ));
                        }
                        Ok(Signal {
                            expr: Expr::Delay(Box::new(sig.expr), n as i64),
                            dither: sig.dither,
                        })
                    }
                    "nodither" => {
                        arity("1", args.len() == 1)?;
                        let sig = self.resolve(&args[0])?;
                        Ok(Signal {
                            expr: sig.expr,
                            dither: false,
                        })
                    }
                    _ => Err(SignalError::Unknown(name.clone())),
                }
            }
        }
    }
}

/// The value of an expression with no generators.
fn fold(e: &Expr) -> Option<f64> {
    Some(match e {
        Expr::Const(v) => *v,
        Expr::Neg(a) => -fold(a)?,
        Expr::Add(a, b) => fold(a)? + fold(b)?,
        Expr::Sub(a, b) => fold(a)? - fold(b)?,
        Expr::Mul(a, b) => fold(a)? * fold(b)?,
        _ => return None,
    })
}

/// Parse a program into one [`Signal`] per polarisation (a single signal is used for all).
/// `seeds` is called once per unseeded `wgn()`.
pub fn parse(
    text: &str,
    n_pols: usize,
    seeds: &mut dyn FnMut() -> u64,
) -> Result<Vec<Signal>, SignalError> {
    let toks = lex(text)?;
    let mut p = Parser {
        toks,
        pos: 0,
        end: text.len(),
    };
    let mut r = Resolver {
        vars: HashMap::new(),
        seeds,
    };
    let mut out = Vec::new();
    while p.pos < p.toks.len() {
        let assign = matches!(
            (
                p.toks.get(p.pos).map(|t| &t.0),
                p.toks.get(p.pos + 1).map(|t| &t.0)
            ),
            (Some(Tok::Name(_)), Some(Tok::Sym('=')))
        );
        if assign {
            let Some(Tok::Name(name)) = p.toks.get(p.pos).map(|t| t.0.clone()) else {
                unreachable!()
            };
            p.pos += 2;
            let node = p.expr()?;
            let sig = r.resolve(&node)?;
            r.vars.insert(name, sig);
        } else {
            let node = p.expr()?;
            out.push(r.resolve(&node)?);
        }
        p.expect(';')?;
    }
    match out.len() {
        1 if n_pols > 1 => Ok(vec![out[0].clone(); n_pols]),
        n if n == n_pols => Ok(out),
        got => Err(SignalError::Count { got, want: n_pols }),
    }
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
    /// Fill `out[i]` with the value at sample `(t0 + i) mod period`.
    pub fn eval(&self, tb: Timebase, t0: u64, out: &mut [f64]) {
        let p = tb.period;
        let at = |i: usize| (t0 + i as u64) % p;
        match self {
            Expr::Const(v) => out.fill(*v),
            Expr::Cw {
                amplitude,
                frequency,
            } => {
                let k = cycles_per_period(*frequency, p, tb.adc_sample_rate).rem_euclid(p as i64)
                    as u128;
                for (i, o) in out.iter_mut().enumerate() {
                    let phase = (k * u128::from(at(i)) % u128::from(p)) as f64 / p as f64;
                    *o = amplitude * (TAU * phase).cos();
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
                let shift = (-(*n)).rem_euclid(p as i64) as u64;
                e.eval(tb, (t0 % p + shift) % p, out);
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
                Box::new(Expr::Delay(
                    Box::new(Expr::Wgn {
                        std: 0.1,
                        seed: 101
                    }),
                    3
                )),
                Box::new(Expr::Const(2.0))
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
        Expr::Delay(Box::new(e.clone()), 5).eval(tb, 100, &mut d);
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
}
