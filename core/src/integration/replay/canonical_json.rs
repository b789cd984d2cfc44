//! Canonical JSON for the fingerprint of
//! `canonical_json()`: a JSON text
//! written in one form, so that formatting alone never makes two requests different, and
//! nothing else ever makes them the same.
//!
//! Written here rather than through `serde_json::Value`, which cannot keep that second
//! promise: it reads numbers into 64-bit floats (an amount past 2^64, `0.1` and
//! `0.10000000000000001` would become one number) and keeps one of several members with
//! the same name (`{"to":"alice","to":"mallory"}` would become `{"to":"mallory"}`). Its
//! `arbitrary_precision` feature would keep numbers, but a Cargo feature is unified across
//! a build: it would change how `serde_json` reads numbers for every crate of the
//! application, and the members would still be dropped.

/// How deep arrays and objects may nest (as `serde_json` allows): a body nested deeper is
/// fingerprinted by its bytes, and the recursion stays far from the stack's end.
const MAX_DEPTH: usize = 128;

/// `body` written in one form, or `None` if it is not one JSON text:
/// - whitespace between tokens is dropped;
/// - the members of each object are sorted by name (their UTF-8 bytes, after unescaping),
///   and members with the same name all stay, in the order they were sent: whichever one
///   a handler's parser reads (the first, the last, or an error), it reads the same one in
///   both bodies;
/// - strings (names and values) are unescaped and written as `serde_json` writes them;
/// - numbers stay exactly as written (`1`, `1.0` and `1e0` differ), never through a float.
pub(crate) fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    let mut parser = Parser { input: body, at: 0 };
    let mut out = Vec::with_capacity(body.len());
    parser.whitespace();
    parser.value(&mut out, 0)?;
    parser.whitespace();
    (parser.at == body.len()).then_some(out)
}

/// A cursor over the body.
struct Parser<'a> {
    input: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.at += 1;
        }
        found
    }

    /// The four whitespace bytes of RFC 8259.
    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn value(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(out, depth + 1),
            b'[' => self.array(out, depth + 1),
            b'"' => self.string(out).map(drop),
            b'-' | b'0'..=b'9' => self.number(out),
            b't' => self.literal(b"true", out),
            b'f' => self.literal(b"false", out),
            b'n' => self.literal(b"null", out),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8], out: &mut Vec<u8>) -> Option<()> {
        let end = self.at + word.len();
        (self.input.get(self.at..end)? == word).then_some(())?;
        self.at = end;
        out.extend_from_slice(word);
        Some(())
    }

    fn array(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.at += 1;
        out.push(b'[');
        self.whitespace();
        if !self.eat(b']') {
            loop {
                self.value(out, depth)?;
                self.whitespace();
                if self.eat(b']') {
                    break;
                }
                self.eat(b',').then_some(())?;
                out.push(b',');
                self.whitespace();
            }
        }
        out.push(b']');
        Some(())
    }

    fn object(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.at += 1;
        self.whitespace();
        // (the name unescaped, the member written), sorted by name once all are read.
        let mut members: Vec<(String, Vec<u8>)> = Vec::new();
        if !self.eat(b'}') {
            loop {
                let mut member = Vec::new();
                if self.peek()? != b'"' {
                    return None;
                }
                let name = self.string(&mut member)?;
                self.whitespace();
                self.eat(b':').then_some(())?;
                member.push(b':');
                self.whitespace();
                self.value(&mut member, depth)?;
                members.push((name, member));
                self.whitespace();
                if self.eat(b'}') {
                    break;
                }
                self.eat(b',').then_some(())?;
                self.whitespace();
            }
        }
        // Stable: members with one name keep the order they were sent in.
        members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        out.push(b'{');
        for (i, (_, member)) in members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(member);
        }
        out.push(b'}');
        Some(())
    }

    /// A string, written in `serde_json`'s form; returns it unescaped (for sorting names).
    fn string(&mut self, out: &mut Vec<u8>) -> Option<String> {
        let start = self.at;
        self.at += 1;
        loop {
            match self.peek()? {
                b'"' => break,
                // The escape's first byte; `serde_json` checks the rest below.
                b'\\' => self.at += 2,
                // Control characters must be escaped inside a string.
                0x00..=0x1f => return None,
                _ => self.at += 1,
            }
        }
        self.at += 1;
        // Unescaped by `serde_json`, which refuses bad escapes, lone surrogates and
        // invalid UTF-8: such a body is not JSON, and is fingerprinted by its bytes.
        let text: String = serde_json::from_slice(&self.input[start..self.at]).ok()?;
        serde_json::to_writer(&mut *out, &text).ok()?;
        Some(text)
    }

    /// A number of RFC 8259's grammar, copied as written.
    fn number(&mut self, out: &mut Vec<u8>) -> Option<()> {
        let start = self.at;
        self.eat(b'-');
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.') {
            self.at_least_one_digit()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if !self.eat(b'+') {
                self.eat(b'-');
            }
            self.at_least_one_digit()?;
        }
        out.extend_from_slice(&self.input[start..self.at]);
        Some(())
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
    }

    fn at_least_one_digit(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::canonical_json;

    fn c(s: &str) -> Option<String> {
        canonical_json(s.as_bytes()).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn formatting_is_forgiven() {
        assert_eq!(
            c(r#"{"a":1, "b":[2, {"d":1,"c":2}]}"#),
            c(" { \"b\" :[2,{\"c\":2,\"d\":1}],\n\"a\":1}\t")
        );
        assert_eq!(c(r#"{"b":1,"a":2}"#).unwrap(), r#"{"a":2,"b":1}"#);
        assert_eq!(c(r#""\u0041\/""#).unwrap(), r#""A/""#);
        assert_eq!(c(r#"{"\u0062":1,"a":2}"#), c(r#"{"a":2,"b":1}"#));
        assert_eq!(c(" [ ] ").unwrap(), "[]");
        assert_eq!(c("{ }").unwrap(), "{}");
        assert_eq!(c("[true,false,null]").unwrap(), "[true,false,null]");
    }

    #[test]
    fn numbers_stay_exactly_as_written() {
        for (a, b) in [
            ("18446744073709551617", "18446744073709551616"),
            ("0.1", "0.10000000000000001"),
            ("123456789012345678901234", "123456789012345678901235"),
            ("1", "1.0"),
            ("1e2", "100"),
            ("-0", "0"),
        ] {
            assert_ne!(c(a), c(b), "{a} and {b}");
            assert_eq!(c(a).unwrap(), a);
        }
        assert_eq!(c("[1E+2,-0.5e-3]").unwrap(), "[1E+2,-0.5e-3]");
    }

    #[test]
    fn repeated_members_all_count_in_their_order() {
        let both = c(r#"{"to":"alice","amount":5,"to":"mallory"}"#).unwrap();
        assert_eq!(both, r#"{"amount":5,"to":"alice","to":"mallory"}"#);
        assert_ne!(Some(both.clone()), c(r#"{"amount":5,"to":"mallory"}"#));
        assert_ne!(
            Some(both.clone()),
            c(r#"{"to":"mallory","amount":5,"to":"alice"}"#)
        );
        assert_eq!(Some(both), c(r#"{"to":"alice","to":"mallory","amount":5}"#));
    }

    #[test]
    fn array_order_counts_and_what_is_not_json_is_refused() {
        assert_ne!(c("[1,2]"), c("[2,1]"));
        for bad in [
            "not json",
            "",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{1:2}",
            "01",
            "1.",
            "-",
            ".5",
            "1e",
            "+1",
            "\"a",
            "\"\u{1}\"",
            r#""\x""#,
            r#""\ud800""#,
            "[1] [2]",
            "tru",
            "nulll",
        ] {
            assert_eq!(c(bad), None, "{bad:?}");
        }
        assert_eq!(canonical_json(b"\"\xff\""), None);
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(c(&deep), None, "deeper than serde_json allows");
        let fine = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert_eq!(c(&fine).as_deref(), Some(fine.as_str()));
    }
}
