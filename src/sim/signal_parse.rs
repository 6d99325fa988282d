//! The parser of the dsim signal language: text → [`Signal`]s, with the grammar, the
//! generators and the limits documented in [`super::signal`]. Every recursion is bounded by
//! [`MAX_DEPTH`] and every signal's expanded size by [`MAX_NODES`] as it is built, so no text
//! can overflow the stack or grow memory faster than the text itself.
#![deny(unsafe_code)]

use std::collections::HashMap;
use std::sync::Arc;

use super::signal::{
    limit, Expr, Signal, SignalError, MAX_DELAY, MAX_DEPTH, MAX_MULTICW, MAX_NODES,
};

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
            let v: f64 = text[start..i].parse().map_err(|_| {
                SignalError::Syntax(format!("bad number {:?}", &text[start..i]), start)
            })?;
            if !v.is_finite() {
                // `1e400` would become inf, which the canonical text cannot write back.
                let what = format!("number {:?} out of range", &text[start..i]);
                return Err(SignalError::Syntax(what, start));
            }
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
    /// Current recursion depth of `expr`/`unary`, bounded by [`MAX_DEPTH`].
    nesting: usize,
}

/// Largest noise seed: 2^53 − 1, the integers an f64 (the language's only number) holds exactly.
const MAX_SEED: u64 = (1 << 53) - 1;

/// A parse-tree node with the depth of the tree under it.
type Parsed = (Node, usize);

/// The deeper of two subtrees plus this node, refused past [`MAX_DEPTH`].
fn deeper(a: usize, b: usize) -> Result<usize, SignalError> {
    let d = a.max(b) + 1;
    if d > MAX_DEPTH {
        return Err(limit("nesting depth", MAX_DEPTH as u64));
    }
    Ok(d)
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
    /// Run `f` one level deeper, refusing to recurse past [`MAX_DEPTH`] (a stack overflow
    /// would kill the process, not just the request).
    fn nest(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<Parsed, SignalError>,
    ) -> Result<Parsed, SignalError> {
        if self.nesting >= MAX_DEPTH {
            return Err(limit("nesting depth", MAX_DEPTH as u64));
        }
        self.nesting += 1;
        let r = f(self);
        self.nesting -= 1;
        r
    }
    fn expr(&mut self) -> Result<Parsed, SignalError> {
        self.nest(|p| {
            let (mut lhs, mut depth) = p.term()?;
            while let Some(Tok::Sym(c @ ('+' | '-'))) = p.peek().cloned() {
                p.pos += 1;
                let (rhs, d) = p.term()?;
                depth = deeper(depth, d)?;
                lhs = Node::Bin(c, Box::new(lhs), Box::new(rhs));
            }
            Ok((lhs, depth))
        })
    }
    fn term(&mut self) -> Result<Parsed, SignalError> {
        let (mut lhs, mut depth) = self.unary()?;
        while self.peek() == Some(&Tok::Sym('*')) {
            self.pos += 1;
            let (rhs, d) = self.unary()?;
            depth = deeper(depth, d)?;
            lhs = Node::Bin('*', Box::new(lhs), Box::new(rhs));
        }
        Ok((lhs, depth))
    }
    fn unary(&mut self) -> Result<Parsed, SignalError> {
        if self.peek() == Some(&Tok::Sym('-')) {
            self.pos += 1;
            return self.nest(|p| {
                let (a, d) = p.unary()?;
                Ok((Node::Neg(Box::new(a)), deeper(d, 0)?))
            });
        }
        self.atom()
    }
    fn atom(&mut self) -> Result<Parsed, SignalError> {
        let at = self.at();
        match self.toks.get(self.pos).map(|t| t.0.clone()) {
            Some(Tok::Num(v)) => {
                self.pos += 1;
                Ok((Node::Num(v), 1))
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
                    return Ok((Node::Var(n), 1));
                }
                self.pos += 1;
                let mut args = Vec::new();
                // One level over the deepest argument (not one per argument: that made a
                // call's canonical text deeper than the signal it stands for).
                let mut depth = 1;
                if self.peek() != Some(&Tok::Sym(')')) {
                    loop {
                        let (a, d) = self.expr()?;
                        depth = depth.max(deeper(d, 0)?);
                        args.push(a);
                        if self.peek() == Some(&Tok::Sym(',')) {
                            self.pos += 1;
                        } else {
                            break;
                        }
                    }
                }
                self.expect(')')?;
                Ok((Node::Call(n, args), depth))
            }
            _ => Err(SignalError::Syntax("expected a value".into(), at)),
        }
    }
}

/// Size of a resolved signal with its variables expanded: what evaluating it costs per sample
/// and how deep the evaluator recurses.
#[derive(Debug, Clone, Copy)]
struct Shape {
    nodes: u64,
    depth: usize,
}

impl Shape {
    const LEAF: Shape = Shape { nodes: 1, depth: 1 };

    /// A generator of `nodes` nodes, printed in canonical text as a call with these numeric
    /// arguments. Re-parsed, that text is a call node over its arguments, and an argument
    /// printed with a '-' sign is a negation over a number, so the generator is that deep:
    /// counted as a leaf of depth 1, a signal of depth 128 had canonical text of depth 129
    /// that did not parse back (found by the `signal` fuzz target).
    fn call(nodes: u64, args: &[f64], kids: &[Shape]) -> Result<Shape, SignalError> {
        let numbers = args.iter().map(|v| Shape {
            nodes: 0,
            depth: 1 + usize::from(v.is_sign_negative()),
        });
        let all: Vec<Shape> = kids.iter().copied().chain(numbers).collect();
        Shape::over(&all, nodes)
    }

    /// A node over `kids`, refused past [`MAX_NODES`] or [`MAX_DEPTH`].
    fn over(kids: &[Shape], own: u64) -> Result<Shape, SignalError> {
        let nodes = kids.iter().map(|k| k.nodes).sum::<u64>() + own;
        let depth = kids.iter().map(|k| k.depth).max().unwrap_or(0) + 1;
        if nodes > MAX_NODES {
            return Err(limit(
                "signal size (nodes after expanding variables)",
                MAX_NODES,
            ));
        }
        if depth > MAX_DEPTH {
            return Err(limit("nesting depth", MAX_DEPTH as u64));
        }
        Ok(Shape { nodes, depth })
    }
}

/// A resolved signal and its shape.
type Resolved = (Signal, Shape);

/// Resolves names and folds generator arguments; `seeds` supplies seeds for unseeded `wgn`.
struct Resolver<'a> {
    vars: HashMap<String, Resolved>,
    seeds: &'a mut dyn FnMut() -> u64,
}

impl Resolver<'_> {
    fn constant(&mut self, name: &str, n: &Node) -> Result<f64, SignalError> {
        let expr = self.resolve(n)?.0.expr;
        let v = fold(&expr).ok_or_else(|| SignalError::NotConstant(name.into()))?;
        if !v.is_finite() {
            // inf and NaN would also not survive the canonical text (`inf` is not a number).
            return Err(SignalError::Value(format!(
                "arguments of {name}() must be finite"
            )));
        }
        Ok(v)
    }

    /// An integer argument of `name` in `0..=max`.
    fn count(
        &mut self,
        name: &str,
        n: &Node,
        what: &'static str,
        max: u64,
    ) -> Result<u64, SignalError> {
        let v = self.constant(name, n)?;
        if v < 0.0 || v.fract() != 0.0 {
            return Err(SignalError::Value(format!(
                "{name}() {what} must be a non-negative integer"
            )));
        }
        if v > max as f64 {
            return Err(limit(what, max));
        }
        Ok(v as u64)
    }

    fn resolve(&mut self, n: &Node) -> Result<Resolved, SignalError> {
        let plain = |expr| Signal { expr, dither: true };
        match n {
            Node::Num(v) => Ok((plain(Expr::Const(*v)), Shape::LEAF)),
            Node::Var(name) => self
                .vars
                .get(name)
                .cloned()
                .ok_or_else(|| SignalError::Unknown(name.clone())),
            Node::Neg(a) => {
                let (a, s) = self.resolve(a)?;
                Ok((plain(Expr::Neg(Arc::new(a.expr))), Shape::over(&[s], 1)?))
            }
            Node::Bin(op, a, b) => {
                let (a, sa) = self.resolve(a)?;
                let (b, sb) = self.resolve(b)?;
                let shape = Shape::over(&[sa, sb], 1)?;
                let (a, b) = (Arc::new(a.expr), Arc::new(b.expr));
                let e = match op {
                    '+' => Expr::Add(a, b),
                    '-' => Expr::Sub(a, b),
                    _ => Expr::Mul(a, b),
                };
                Ok((plain(e), shape))
            }
            Node::Call(name, args) => self.call(name, args),
        }
    }

    fn call(&mut self, name: &str, args: &[Node]) -> Result<Resolved, SignalError> {
        let plain = |expr| Signal { expr, dither: true };
        let arity = |want: &'static str, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(SignalError::Arity(name.into(), want, args.len()))
            }
        };
        match name {
            "cw" | "comb" => {
                arity("2", args.len() == 2)?;
                let amplitude = self.constant(name, &args[0])?;
                let frequency = self.constant(name, &args[1])?;
                let e = if name == "cw" {
                    Expr::Cw {
                        amplitude,
                        frequency,
                    }
                } else {
                    Expr::Comb {
                        amplitude,
                        frequency,
                    }
                };
                Ok((plain(e), Shape::call(1, &[amplitude, frequency], &[])?))
            }
            "multicw" => {
                arity("5", args.len() == 5)?;
                let count = self.count(name, &args[0], "multicw() count", MAX_MULTICW)?;
                if count == 0 {
                    return Err(SignalError::Value(
                        "multicw() count must be a positive integer".into(),
                    ));
                }
                let v: Vec<f64> = args[1..]
                    .iter()
                    .map(|a| self.constant(name, a))
                    .collect::<Result<_, _>>()?;
                let e = Expr::MultiCw {
                    count,
                    amplitude: v[0],
                    amplitude_step: v[1],
                    frequency: v[2],
                    frequency_step: v[3],
                };
                Ok((plain(e), Shape::call(count, &v, &[])?))
            }
            "wgn" => {
                arity("1 or 2", matches!(args.len(), 1 | 2))?;
                let std = self.constant(name, &args[0])?;
                let seed = match args.get(1) {
                    // Seeds fit an f64 exactly, so the canonical text reproduces the noise.
                    Some(a) => self.count(name, a, "wgn() seed", MAX_SEED)?,
                    None => (self.seeds)() & MAX_SEED,
                };
                Ok((plain(Expr::Wgn { std, seed }), Shape::call(1, &[std], &[])?))
            }
            "delay" => {
                arity("2", args.len() == 2)?;
                let (sig, s) = self.resolve(&args[0])?;
                let n = self.constant(name, &args[1])?;
                if n.fract() != 0.0 {
                    return Err(SignalError::Value(
                        "delay() takes a whole number of samples".into(),
                    ));
                }
                if n.abs() > MAX_DELAY {
                    return Err(limit("delay() in samples", MAX_DELAY as u64));
                }
                let e = Expr::Delay(Arc::new(sig.expr), n as i64);
                let sig = Signal {
                    expr: e,
                    dither: sig.dither,
                };
                Ok((sig, Shape::call(1, &[n], &[s])?))
            }
            "nodither" => {
                arity("1", args.len() == 1)?;
                let (sig, s) = self.resolve(&args[0])?;
                let sig = Signal {
                    expr: sig.expr,
                    dither: false,
                };
                Ok((sig, s))
            }
            _ => Err(SignalError::Unknown(name.into())),
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
        nesting: 0,
    };
    let mut r = Resolver {
        vars: HashMap::new(),
        seeds,
    };
    let mut out = Vec::new();
    while p.pos < p.toks.len() {
        let assign = match (p.toks.get(p.pos), p.toks.get(p.pos + 1)) {
            (Some((Tok::Name(name), _)), Some((Tok::Sym('='), _))) => Some(name.clone()),
            _ => None,
        };
        if let Some(name) = assign {
            p.pos += 2;
            let (node, _) = p.expr()?;
            let resolved = r.resolve(&node)?;
            r.vars.insert(name, resolved);
        } else {
            let (node, _) = p.expr()?;
            out.push(r.resolve(&node)?.0);
        }
        p.expect(';')?;
    }
    match out.len() {
        1 if n_pols > 1 => Ok(vec![out[0].clone(); n_pols]),
        n if n == n_pols => Ok(out),
        got => Err(SignalError::Count { got, want: n_pols }),
    }
}
