//! katcp messages: parsing and formatting, with katcp's escapes and message ids.

use super::MAX_ARGS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Request,
    Reply,
    Inform,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub kind: Kind,
    pub name: String,
    pub mid: Option<u32>,
    pub args: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("empty message")]
    Empty,
    #[error("message must start with '?', '!' or '#'")]
    Type,
    #[error("bad message name {0:?}")]
    Name(String),
    #[error("bad message id")]
    Mid,
    #[error("bad escape sequence")]
    Escape,
    #[error("argument is not UTF-8")]
    Utf8,
    #[error("more than {0} arguments")]
    TooManyArgs(usize),
}

fn unescape(arg: &str) -> Result<String, ParseError> {
    if arg == "\\@" {
        return Ok(String::new());
    }
    let mut out = String::with_capacity(arg.len());
    let mut chars = arg.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next() {
            Some('\\') => '\\',
            Some('_') => ' ',
            Some('0') => '\0',
            Some('n') => '\n',
            Some('r') => '\r',
            Some('e') => '\x1b',
            Some('t') => '\t',
            _ => return Err(ParseError::Escape),
        });
    }
    Ok(out)
}

fn escape(arg: &str) -> String {
    if arg.is_empty() {
        return "\\@".into();
    }
    let mut out = String::with_capacity(arg.len());
    for c in arg.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            ' ' => out.push_str("\\_"),
            '\0' => out.push_str("\\0"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\x1b' => out.push_str("\\e"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out
}

impl Message {
    pub fn new(kind: Kind, name: &str, mid: Option<u32>, args: Vec<String>) -> Message {
        Message {
            kind,
            name: name.into(),
            mid,
            args,
        }
    }

    /// Parse one line (without its terminator), with at most [`MAX_ARGS`] arguments.
    pub fn parse(line: &[u8]) -> Result<Message, ParseError> {
        Message::parse_bounded(line, MAX_ARGS)
    }

    /// Parse one line (without its terminator), with at most `max_args` arguments.
    pub fn parse_bounded(line: &[u8], max_args: usize) -> Result<Message, ParseError> {
        let line = std::str::from_utf8(line).map_err(|_| ParseError::Utf8)?;
        let mut words = line.split([' ', '\t']).filter(|w| !w.is_empty());
        let head = words.next().ok_or(ParseError::Empty)?;
        let kind = match head.as_bytes()[0] {
            b'?' => Kind::Request,
            b'!' => Kind::Reply,
            b'#' => Kind::Inform,
            _ => return Err(ParseError::Type),
        };
        let head = &head[1..];
        let (name, mid) = match head.split_once('[') {
            Some((n, rest)) => {
                let id = rest.strip_suffix(']').ok_or(ParseError::Mid)?;
                let id: u32 = id.parse().map_err(|_| ParseError::Mid)?;
                if id == 0 {
                    return Err(ParseError::Mid);
                }
                (n, Some(id))
            }
            None => (head, None),
        };
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !valid {
            return Err(ParseError::Name(name.into()));
        }
        let mut args = Vec::new();
        for w in words {
            if args.len() == max_args {
                return Err(ParseError::TooManyArgs(max_args));
            }
            args.push(unescape(w)?);
        }
        Ok(Message {
            kind,
            name: name.into(),
            mid,
            args,
        })
    }

    /// The wire form, newline-terminated.
    pub fn to_line(&self) -> String {
        let sigil = match self.kind {
            Kind::Request => '?',
            Kind::Reply => '!',
            Kind::Inform => '#',
        };
        let mut s = format!("{sigil}{}", self.name);
        if let Some(m) = self.mid {
            s.push_str(&format!("[{m}]"));
        }
        for a in &self.args {
            s.push(' ');
            s.push_str(&escape(a));
        }
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_escape() {
        let m = Message::parse(b"?signals[12] cw(0.1,\\_1e6);\\_ \\@ a\\\\b").unwrap();
        assert_eq!(m.kind, Kind::Request);
        assert_eq!(m.name, "signals");
        assert_eq!(m.mid, Some(12));
        assert_eq!(m.args, ["cw(0.1, 1e6); ", "", "a\\b"]);
        assert_eq!(m.to_line(), "?signals[12] cw(0.1,\\_1e6);\\_ \\@ a\\\\b\n");
    }

    #[test]
    fn malformed_lines() {
        assert_eq!(Message::parse(b""), Err(ParseError::Empty));
        assert_eq!(Message::parse(b"help"), Err(ParseError::Type));
        assert_eq!(
            Message::parse(b"?1abc"),
            Err(ParseError::Name("1abc".into()))
        );
        assert_eq!(Message::parse(b"?x[0]"), Err(ParseError::Mid));
        assert_eq!(Message::parse(b"?x[1"), Err(ParseError::Mid));
        assert_eq!(Message::parse(b"?x a\\q"), Err(ParseError::Escape));
        assert_eq!(
            Message::parse(&[b'?', b'x', b' ', 0xff]),
            Err(ParseError::Utf8)
        );
    }
}
