//! [`IdempotencyKey`]: the `Idempotency-Key` header of the IETF draft.

use http::HeaderName;

use super::{ExtractError, KeyExtractor, RequestView, header::parse_name};

/// The longest idempotency key accepted, in characters.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// The `Idempotency-Key` header, as the IETF `draft-ietf-httpapi-idempotency-key-header`
/// defines it: a structured-field string (`"8e03978e"`), with the bare form (`8e03978e`)
/// also accepted. At most [`MAX_IDEMPOTENCY_KEY_LEN`] characters of printable ASCII;
/// anything else is malformed (`400`).
///
/// The value is the unquoted key; the kind is `idempotency-key`.
///
/// [`header`](Self::header) reads the same syntax from a header of another name
/// (`X-Idempotency-Key` is common); its kind is then `idempotency-key(<name>)`.
#[derive(Debug, Clone, Default)]
pub struct IdempotencyKey {
    /// `None`: `Idempotency-Key`. Otherwise the header (or why the name given is not one)
    /// and the kind.
    header: Option<(Result<HeaderName, String>, String)>,
}

impl IdempotencyKey {
    /// The `Idempotency-Key` header.
    pub fn new() -> Self {
        Self { header: None }
    }

    /// The header named `name` (any case), with the syntax of `Idempotency-Key`: given as
    /// text, or as a `HeaderName` of either `http` version, as for
    /// [`HeaderKey::new`](super::HeaderKey::new). A name that is not a valid header name
    /// makes `LockLayerBuilder::build` fail with
    /// [`ConfigError::Extractor`](crate::ConfigError::Extractor).
    ///
    /// ```
    /// use tower_lock::key::{IdempotencyKey, KeyExtractor};
    ///
    /// let key = IdempotencyKey::header("X-Idempotency-Key");
    /// let req = http::Request::post("/").header("x-idempotency-key", "\"k-1\"").body(()).unwrap();
    /// assert_eq!(key.extract(&req).unwrap().as_deref(), Some("k-1"));
    /// assert_eq!(key.kind(), "idempotency-key(x-idempotency-key)");
    /// assert!(IdempotencyKey::header("x idempotency key").validate().is_err());
    /// ```
    pub fn header(name: impl AsRef<str>) -> Self {
        let name = parse_name(name.as_ref());
        let kind = match &name {
            Ok(name) if name == "idempotency-key" => return Self::new(),
            Ok(name) => format!("idempotency-key({name})"),
            Err(_) => "idempotency-key()".to_owned(),
        };
        Self {
            header: Some((name, kind)),
        }
    }

    /// Parse one header value.
    pub fn parse(raw: &[u8]) -> Result<String, ExtractError> {
        let raw = raw.trim_ascii();
        let value = match raw {
            [b'"', inner @ .., b'"'] => unquote(inner)?,
            [b'"', ..] => {
                return Err(ExtractError::malformed(
                    "the Idempotency-Key header has an unterminated quoted string",
                ));
            }
            bare => {
                if bare.contains(&b'"') || bare.contains(&b'\\') {
                    return Err(ExtractError::malformed(
                        "the Idempotency-Key header has a quote or backslash outside a quoted string",
                    ));
                }
                bare.to_vec()
            }
        };
        if value.is_empty() {
            return Err(ExtractError::malformed(
                "the Idempotency-Key header is empty",
            ));
        }
        if value.len() > MAX_IDEMPOTENCY_KEY_LEN {
            return Err(ExtractError::malformed(format!(
                "the Idempotency-Key is {} characters long, more than {MAX_IDEMPOTENCY_KEY_LEN}",
                value.len()
            )));
        }
        if !value.iter().all(|b| (0x20..=0x7e).contains(b)) {
            return Err(ExtractError::malformed(
                "the Idempotency-Key must be printable ASCII",
            ));
        }
        // Printable ASCII is valid UTF-8.
        Ok(String::from_utf8(value).expect("printable ASCII"))
    }
}

/// Unescape the inside of a structured-field string: `\"` and `\\` only.
fn unquote(inner: &[u8]) -> Result<Vec<u8>, ExtractError> {
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => {
                    return Err(ExtractError::malformed(
                        "the Idempotency-Key header has an invalid escape",
                    ));
                }
            },
            b'"' => {
                return Err(ExtractError::malformed(
                    "the Idempotency-Key header has an unescaped quote",
                ));
            }
            b => out.push(b),
        }
    }
    Ok(out)
}

impl KeyExtractor for IdempotencyKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        let name = match &self.header {
            None => "idempotency-key",
            Some((Ok(name), _)) => name.as_str(),
            // Unreachable through a built layer, which `validate` refused.
            Some((Err(e), _)) => return Err(ExtractError::misconfigured(e.clone())),
        };
        match req.header(name) {
            None if self.header.is_none() => {
                Err(ExtractError::missing("an Idempotency-Key header"))
            }
            None => Err(ExtractError::missing(format!("the {name} header"))),
            Some(raw) => Self::parse(raw).map(Some),
        }
    }

    fn kind(&self) -> &str {
        self.header
            .as_ref()
            .map_or("idempotency-key", |(_, kind)| kind.as_str())
    }

    fn validate(&self) -> Result<(), String> {
        match &self.header {
            Some((Err(e), _)) => Err(e.clone()),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_key_accepts_quoted_and_bare_values() {
        assert_eq!(IdempotencyKey::parse(b"\"abc\"").unwrap(), "abc");
        assert_eq!(IdempotencyKey::parse(b"abc").unwrap(), "abc");
        assert_eq!(IdempotencyKey::parse(br#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
        assert_eq!(IdempotencyKey::parse(b"  \"x y\" ").unwrap(), "x y");
    }

    #[test]
    fn idempotency_key_refuses_malformed_values() {
        for bad in [
            &b"\"\""[..],
            b"",
            b"\"abc",
            b"a\"bc",
            b"\"a\"b\"",
            b"\"a\\nb\"",
            b"caf\xc3\xa9",
        ] {
            assert!(IdempotencyKey::parse(bad).is_err(), "{bad:?} accepted");
        }
        let long = vec![b'k'; MAX_IDEMPOTENCY_KEY_LEN + 1];
        assert!(IdempotencyKey::parse(&long).is_err());
        let max = vec![b'k'; MAX_IDEMPOTENCY_KEY_LEN];
        assert!(IdempotencyKey::parse(&max).is_ok());
    }
}
