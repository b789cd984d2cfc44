//! Keys are data, never syntax (DESIGN.md): the lock key of a request is an injective
//! encoding of (layer namespace, extractor kind, extracted value). Nothing a client sends
//! to one layer can spell the key of another layer or of another extractor.
//!
//! The same promise over a real socket: the HTTP scenarios (`in_process.rs` beside it).

use http::HeaderName;
use proptest::prelude::*;
use tower_lock::{
    LockEngine, LockLayer, LockLayerBuilder, MissingKeyPolicy,
    key::{
        self, GlobalKey, HeaderKey, IdempotencyKey, KeyExtractor, MethodPathKey, PathKey,
        Principal, RequestView, ScopedKey,
    },
};
use tower_lock_core::RequestLocker;

/// A layer's key extractor, as the test models it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Extractor {
    /// `HeaderKey` on the named header.
    Header(&'static str),
    /// `IdempotencyKey`.
    Idempotency,
    /// `ScopedKey` by the named header, around an inner extractor.
    Scoped(&'static str, Box<Self>),
    /// `ScopedKey` by the [`Account`] principal, around an inner extractor.
    PrincipalScoped(Box<Self>),
    /// `PathKey`.
    Path,
    /// `MethodPathKey`.
    MethodPath,
    /// `GlobalKey` with this key.
    Global(String),
    /// A closure keying on the `x-custom` header.
    Custom,
}

/// What a request says, in the terms of the extractor that reads it: a header value, a
/// scope and an inner value, a method and a path.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Value {
    One(String),
    Scoped(String, Box<Self>),
    MethodPath(String, String),
    /// `GlobalKey` reads nothing from the request.
    Nothing,
}

/// One layer and one request to it. Two cases are the same (namespace, extractor, value)
/// exactly when they are equal.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Case {
    namespace: String,
    extractor: Extractor,
    value: Value,
}

/// The principal an authentication layer put in the request extensions.
#[derive(Clone)]
struct Account(String);

impl std::fmt::Display for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The closure extractor of the model: the trimmed `x-custom` header.
fn custom(req: &dyn RequestView) -> Option<String> {
    req.header("x-custom")
        .map(|v| String::from_utf8(v.to_vec()).unwrap().trim().to_owned())
}

impl Extractor {
    /// A builder keyed on this extractor.
    fn apply(&self, builder: LockLayerBuilder) -> LockLayerBuilder {
        let header = |name: &'static str| HeaderName::from_static(name);
        match self {
            Self::Header(name) => builder.key(HeaderKey::new(header(name))),
            Self::Idempotency => builder.key(IdempotencyKey::new()),
            Self::Path => builder.key(PathKey),
            Self::MethodPath => builder.key(MethodPathKey),
            Self::Global(key) => builder.key(GlobalKey::new(key.clone())),
            Self::Custom => builder.key(key::from_fn("custom", custom)),
            Self::Scoped(scope, inner) => scope_by(builder, HeaderKey::new(scope), inner),
            Self::PrincipalScoped(inner) => scope_by(builder, Principal::<Account>::new(), inner),
        }
    }
}

/// A builder keyed on the model's `inner` extractor within `scope`.
fn scope_by(
    builder: LockLayerBuilder,
    scope: impl KeyExtractor,
    inner: &Extractor,
) -> LockLayerBuilder {
    match inner {
        Extractor::Header(name) => builder.key(ScopedKey::by(scope, HeaderKey::new(name))),
        Extractor::Idempotency => builder.key(ScopedKey::by(scope, IdempotencyKey::new())),
        Extractor::Custom => builder.key(ScopedKey::by(scope, key::from_fn("custom", custom))),
        other => unreachable!("the model scopes no {other:?}"),
    }
}

impl Case {
    fn locker(&self, engine: &LockEngine) -> RequestLocker {
        self.extractor
            .apply(LockLayer::builder(engine.clone()))
            .namespace(self.namespace.clone())
            .on_missing_key(MissingKeyPolicy::PassThrough)
            .build_locker()
            .unwrap_or_else(|e| panic!("{self:?}: {e}"))
    }

    /// The request that says `self.value` to `self.extractor`, or `None` when no valid
    /// HTTP request says it (a path that is no URI path).
    fn request(&self) -> Option<http::Request<()>> {
        let mut req = http::Request::builder().method("POST").uri("/");
        fn say(
            req: http::request::Builder,
            extractor: &Extractor,
            value: &Value,
        ) -> http::request::Builder {
            match (extractor, value) {
                (Extractor::Header(name), Value::One(v)) => req.header(*name, v),
                (Extractor::Idempotency, Value::One(v)) => req.header("idempotency-key", v),
                (Extractor::Custom, Value::One(v)) => req.header("x-custom", v),
                (Extractor::Path, Value::One(path)) => req.uri(path),
                (Extractor::MethodPath, Value::MethodPath(method, path)) => {
                    req.method(method.as_str()).uri(path)
                }
                (Extractor::Scoped(scope, inner), Value::Scoped(s, v)) => {
                    say(req.header(*scope, s), inner, v)
                }
                (Extractor::PrincipalScoped(inner), Value::Scoped(s, v)) => {
                    say(req.extension(Account(s.clone())), inner, v)
                }
                (Extractor::Global(_), Value::Nothing) => req,
                other => unreachable!("no request says {other:?}"),
            }
        }
        req = say(req, &self.extractor, &self.value);
        req.body(()).ok()
    }

    /// The lock key the layer takes for the request, if it takes one.
    fn key(&self, engine: &LockEngine) -> Option<String> {
        let req = self.request()?;
        match self.locker(engine).key(&req) {
            Ok(Some(key)) => Some(key.as_str().to_owned()),
            // No key, a malformed one, one too long: no lock, nothing to collide.
            Ok(None) | Err(_) => None,
        }
    }
}

/// Words with a meaning somewhere: separators, braces (Redis Cluster hash tags), the
/// engine's own key words, the extractors' old key words, digits that look like lengths.
const WORDS: &[&str] = &[
    "",
    "a",
    "b",
    "X",
    ":",
    "|",
    "/",
    "{",
    "}",
    "=",
    "%",
    " ",
    "(",
    ")",
    ",",
    "lock",
    "queue",
    "fence",
    "wake",
    "idempotency-key",
    "tenant",
    "path",
    "route",
    "header",
    "scoped",
    "scope",
    "principal",
    "global",
    "custom",
    "POST",
    "0",
    "1",
    "4",
    "15",
];

/// Text made of a few words, so that different cases often spell the same string.
fn text(max_words: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(WORDS), 0..=max_words).prop_map(|w| w.concat())
}

/// A header value as a client sends it: no surrounding blanks (extractors trim them).
fn header_value() -> impl Strategy<Value = String> {
    text(4).prop_map(|v| v.trim().to_owned())
}

fn path() -> impl Strategy<Value = String> {
    text(4).prop_map(|p| format!("/{p}"))
}

fn plain_extractor() -> impl Strategy<Value = Extractor> {
    prop_oneof![
        prop::sample::select(&["x-key", "x-tenant", "idempotency-key"][..])
            .prop_map(Extractor::Header),
        Just(Extractor::Idempotency),
        Just(Extractor::Path),
        Just(Extractor::MethodPath),
        text(3).prop_map(Extractor::Global),
        Just(Extractor::Custom),
    ]
}

fn extractor() -> impl Strategy<Value = Extractor> {
    let inner = || {
        prop_oneof![
            Just(Extractor::Header("x-key")),
            Just(Extractor::Idempotency),
            Just(Extractor::Custom),
        ]
    };
    prop_oneof![
        3 => plain_extractor(),
        1 => inner().prop_map(|inner| Extractor::PrincipalScoped(Box::new(inner))),
        1 => (
            prop::sample::select(&["x-tenant", "x-org"][..]),
            inner(),
        )
            .prop_map(|(scope, inner)| Extractor::Scoped(scope, Box::new(inner))),
    ]
}

fn value_for(extractor: &Extractor) -> BoxedStrategy<Value> {
    match extractor {
        Extractor::Header(_) | Extractor::Idempotency | Extractor::Custom => {
            header_value().prop_map(Value::One).boxed()
        }
        Extractor::Path => path().prop_map(Value::One).boxed(),
        Extractor::MethodPath => (prop::sample::select(&["GET", "POST", "LOCK"][..]), path())
            .prop_map(|(m, p)| Value::MethodPath(m.to_owned(), p))
            .boxed(),
        Extractor::Global(_) => Just(Value::Nothing).boxed(),
        Extractor::Scoped(_, inner) | Extractor::PrincipalScoped(inner) => {
            (header_value(), value_for(inner))
                .prop_map(|(scope, v)| Value::Scoped(scope, Box::new(v)))
                .boxed()
        }
    }
}

/// A namespace: often one shared by other layers (empty, or a prefix of another), sometimes
/// any text.
fn namespace() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::sample::select(&["", "a", "ab", ":"][..]).prop_map(str::to_owned),
        1 => text(3),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (namespace(), extractor()).prop_flat_map(|(namespace, extractor)| {
        value_for(&extractor).prop_map(move |value| Case {
            namespace: namespace.clone(),
            extractor: extractor.clone(),
            value,
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Among many layers and requests, two take one lock only when they are the same
    /// (namespace, extractor, value).
    #[test]
    fn different_namespaces_extractors_or_values_never_share_a_lock(
        cases in prop::collection::vec(case(), 2..24)
    ) {
        let engine = LockEngine::in_memory();
        let mut seen: Vec<(String, &Case)> = Vec::new();
        for case in &cases {
            let Some(key) = case.key(&engine) else { continue };
            for (other_key, other) in &seen {
                if *other_key == key {
                    prop_assert_eq!(
                        *other, case,
                        "two different layers or requests share the lock {:?}", key
                    );
                }
            }
            seen.push((key, case));
        }
    }
}

proptest! {
    /// Text moved from the end of the namespace to the start of the value (`a` + `bX`
    /// against `ab` + `X`) names another lock.
    #[test]
    fn text_moved_between_namespace_and_value_takes_another_lock(
        p in text(2),
        q in text(2),
        v in header_value(),
        extractor in prop_oneof![
            Just(Extractor::Header("x-key")),
            Just(Extractor::Custom),
            Just(Extractor::Global(String::new())),
        ],
    ) {
        let moved = format!("{q}{v}");
        prop_assume!(!q.is_empty() && moved.trim() == moved);
        let (value, moved_value, extractor, moved_extractor) = match extractor {
            Extractor::Global(_) => (
                Value::Nothing,
                Value::Nothing,
                Extractor::Global(v),
                Extractor::Global(moved),
            ),
            other => (Value::One(v), Value::One(moved), other.clone(), other),
        };
        let engine = LockEngine::in_memory();
        let before = Case { namespace: format!("{p}{q}"), extractor, value };
        let after = Case { namespace: p, extractor: moved_extractor, value: moved_value };
        if let (Some(a), Some(b)) = (before.key(&engine), after.key(&engine)) {
            prop_assert_ne!(a, b, "{:?} and {:?} share a lock", before, after);
        }
    }
}

fn key_of(namespace: &str, extractor: Extractor, value: Value) -> String {
    let case = Case {
        namespace: namespace.to_owned(),
        extractor,
        value,
    };
    case.key(&LockEngine::in_memory())
        .unwrap_or_else(|| panic!("{case:?} takes a lock"))
}

fn one(v: &str) -> Value {
    Value::One(v.to_owned())
}

#[test]
fn namespace_a_with_key_bx_is_not_namespace_ab_with_key_x() {
    assert_ne!(
        key_of("a", Extractor::Header("x-key"), one("bX")),
        key_of("ab", Extractor::Header("x-key"), one("X")),
    );
}

#[test]
fn a_plain_header_cannot_spell_the_idempotency_presets_key() {
    assert_ne!(
        key_of("", Extractor::Header("x-key"), one("idempotency-key:k")),
        key_of("", Extractor::Idempotency, one("k")),
    );
}

#[test]
fn a_plain_header_cannot_spell_a_tenant_scoped_key() {
    let scoped = Extractor::Scoped("x-tenant", Box::new(Extractor::Idempotency));
    assert_ne!(
        key_of(
            "",
            Extractor::Header("x-key"),
            one("tenant:4:acme|idempotency-key:k")
        ),
        key_of(
            "",
            scoped,
            Value::Scoped("acme".to_owned(), Box::new(one("k")))
        ),
    );
}

#[test]
fn a_header_cannot_spell_a_path_key_and_a_closure_cannot_spell_a_global_key() {
    assert_ne!(
        key_of("", Extractor::Header("x-key"), one("path:/reports")),
        key_of("", Extractor::Path, one("/reports")),
    );
    assert_ne!(
        key_of("", Extractor::Custom, one("maintenance")),
        key_of(
            "",
            Extractor::Global("maintenance".to_owned()),
            Value::Nothing
        ),
    );
}

#[test]
fn a_header_key_on_the_idempotency_header_is_not_the_idempotency_key() {
    assert_ne!(
        key_of("", Extractor::Header("idempotency-key"), one("k")),
        key_of("", Extractor::Idempotency, one("k")),
    );
}
