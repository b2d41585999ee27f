//! Check requests from the JSON body of `POST /v1/check` and `POST /json`, read in one pass.
//!
//! Why not a `serde_json::Value` tree walked afterwards: the tree costs an allocation per
//! object, per key and per string, then a copy of every string we keep and a drop of the whole
//! tree, a large share of an HTTP check's work (BENCHMARKS-HISTORY.md). Why not a derived
//! struct: every mistake would become one generic serde message, and users are owed a code and
//! a message per mistake (never a 500).
//!
//! So it is done in two steps:
//! 1. collecting: each known field is read straight from the tokenizer into a `Got`: absent
//!    (or `null`, which protojson treats alike), the expected kind, or anything else kept as a
//!    `Value` for the error message;
//! 2. `assemble`: the collected fields are checked in a fixed order.
//!
//! A request with several mistakes therefore gets the same error whatever the order of its
//! keys. Unknown fields are skipped for forward compatibility. They are still read (as a
//! `Value`), so exactly the JSON a `Value` accepts is accepted: serde's `IgnoredAny` lets lone
//! surrogate escapes through.
//!
//! A key given twice in one object, at any depth (known field or not, inside an unknown field's
//! value too), is `duplicate_key`, naming the key: a proxy in front may read the first of two
//! `domain`s where a map keeps the last, and the two must not disagree on what was asked
//! (parser-differential safety). Known fields are tracked in a bitset per object, so the check
//! allocates nothing for a request without unknown fields; unknown keys are remembered in a set
//! created at the first one. In protojson (`/json`) a field given under both of its names
//! (`hits_addend` and `hitsAddend`) is the same field twice, and a duplicate as well.
//!
//! Counts are bounded while reading: the reader stops at the descriptor past
//! `max_descriptors` and at the entry past `max_entries` (`too_many_descriptors`,
//! `too_many_entries`, naming the limit: the rest is never read, so its total is unknown), so a
//! body of thousands of empty descriptors costs what the limit allows, not what it holds. Fields
//! that are not read (unknown ones, or of the wrong type) may hold at most `MAX_UNREAD` values
//! in all, for the same reason. The other size limits are applied by
//! `crate::check::validate`.

use crate::error::ApiError;
use crate::model::unit_from_number;
use crate::model::{CheckRequest, Descriptor};
use crate::state::RequestLimits;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::cell::Cell;
use std::collections::BTreeSet;
use std::fmt;
use std::marker::PhantomData;
use tollgate_core::limiter::LimitOverride;

/// Which JSON spelling a request uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `/v1/check`: snake_case, integers as JSON numbers, `hits_addend: 0` is a pure query.
    Native,
    /// `/json`: protojson `RateLimitRequest`; camelCase or snake_case names, 64-bit integers
    /// may be strings, request `hitsAddend` 0 or absent means 1 (as Envoy).
    ProtoJson,
}

/// Parse a check request body (see [`Dialect`]). Invalid JSON is `invalid_json`, a key given
/// twice `duplicate_key`; JSON of the wrong shape gets the code of its first mistake
/// (`invalid_request`, `invalid_hits`, ...).
pub fn parse_request(body: &[u8], d: Dialect) -> Result<CheckRequest, ApiError> {
    parse_request_within(body, d, &RequestLimits::default())
}

/// [`parse_request`] reading at most `limits.max_descriptors` descriptors and
/// `limits.max_entries` entries per descriptor: one more is refused where it starts.
pub fn parse_request_within(
    body: &[u8],
    d: Dialect,
    limits: &RequestLimits,
) -> Result<CheckRequest, ApiError> {
    if let Some(req) = plain::read(body, limits.max_descriptors, limits.max_entries) {
        return Ok(req);
    }
    let (over, unread) = (Cell::new(None), Cell::new(MAX_UNREAD));
    let bounds = Bounds {
        descriptors: limits.max_descriptors,
        entries: limits.max_entries,
        over: &over,
        unread: &unread,
    };
    let collected = collect(body, bounds).map_err(|e| {
        if let Some(o) = over.get() {
            return o.error(limits);
        }
        // The only other data (not syntax) error collecting raises is a duplicate key.
        if e.classify() == serde_json::error::Category::Data {
            ApiError::invalid(DUPLICATE_KEY, e.to_string())
        } else {
            ApiError::invalid("invalid_json", format!("body is not valid JSON: {e}"))
        }
    })?;
    assemble(collected, d)
}

/// The error code of a key given twice.
const DUPLICATE_KEY: &str = "duplicate_key";

/// The error raised while reading an object that names `key` twice.
fn duplicate<E: serde::de::Error>(key: &str) -> E {
    E::custom(format_args!("duplicate key `{key}`"))
}

/// A count limit met while reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    Descriptors,
    /// Too many entries in the descriptor at this index (`usize::MAX` until the descriptor
    /// list fills it in).
    Entries(usize),
    /// More than [`MAX_UNREAD`] values in fields that are not read.
    Unread,
}

impl Over {
    fn error(self, limits: &RequestLimits) -> ApiError {
        match self {
            Over::Descriptors => ApiError::too_many_descriptors(limits.max_descriptors),
            Over::Entries(i) => ApiError::too_many_entries(i, limits.max_entries),
            Over::Unread => ApiError::invalid(
                "invalid_request",
                format!(
                    "more than {MAX_UNREAD} values in fields that are not read \
                     (unknown fields, or fields of the wrong type)"
                ),
            ),
        }
    }
}

/// Most array elements and object members a request may hold in fields that are not read:
/// unknown ones (skipped for forward compatibility) and ones of the wrong type (kept for the
/// error message). They are still parsed, so without a bound an unknown field of thousands of
/// empty objects would cost what the descriptor limit saves.
const MAX_UNREAD: usize = 1024;

/// The count limits of a read, and where the one met is recorded (the serde error that stops
/// the read carries no data of ours).
#[derive(Clone, Copy)]
struct Bounds<'b> {
    descriptors: usize,
    entries: usize,
    over: &'b Cell<Option<Over>>,
    /// What is left of [`MAX_UNREAD`].
    unread: &'b Cell<usize>,
}

impl<'b> Bounds<'b> {
    /// Spend one unread value; the error that stops the read when none is left.
    fn spend<E: serde::de::Error>(self) -> Result<(), E> {
        match self.unread.get().checked_sub(1) {
            Some(left) => {
                self.unread.set(left);
                Ok(())
            }
            None => {
                self.over.set(Some(Over::Unread));
                Err(E::custom("count limit"))
            }
        }
    }

    /// A list of objects of kind `O`, at most `max` of them (`over` records the limit met).
    fn list<O>(self, max: usize, over: Over) -> List<'b, Fields<'b, O>> {
        List {
            item: Fields(PhantomData, self),
            max,
            over,
            bounds: self,
        }
    }
}

/// The request's fields as read, or the JSON syntax error (or the error that stopped the read
/// at a count limit, recorded in `bounds`).
fn collect(body: &[u8], bounds: Bounds<'_>) -> Result<Got<RawBody>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let got = Slot(Fields::<RawBody>(PhantomData, bounds)).deserialize(&mut de)?;
    de.end()?;
    Ok(got)
}

// ---------------------------------------------------------------------------------------------
// The plain shape

/// The request nearly every client sends, read without serde: a `domain` string and a
/// non-empty `descriptors` array of objects that hold only a non-empty `entries` array of
/// `{"key": ..., "value": ...}` (in that order), every string free of escapes and control
/// characters, the two top-level fields once each in either order, JSON whitespace anywhere.
/// Anything else (a `hits_addend`, a `limit`, an unknown or repeated key, an escape, an error)
/// is `None`, and [`parse_request`] reads the body with the general reader: this is only a
/// faster way to the same [`CheckRequest`] (a property test holds it to that).
mod plain {
    use crate::model::{CheckRequest, Descriptor};

    /// The request, if `body` has the plain shape.
    pub(super) fn read(
        body: &[u8],
        max_descriptors: usize,
        max_entries: usize,
    ) -> Option<CheckRequest> {
        let mut r = Reader { b: body, i: 0 };
        r.expect(b'{')?;
        let (mut domain, mut descriptors) = (None, None);
        loop {
            match r.raw()? {
                b"domain" if domain.is_none() => {
                    r.expect(b':')?;
                    domain = Some(r.string()?.to_owned());
                }
                b"descriptors" if descriptors.is_none() => {
                    r.expect(b':')?;
                    descriptors = Some(r.list(max_descriptors, |r| r.descriptor(max_entries))?);
                }
                _ => return None,
            }
            match r.next()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
        r.skip_ws();
        if r.i != body.len() {
            return None;
        }
        Some(CheckRequest {
            domain: domain?,
            descriptors: descriptors?,
            hits: None,
        })
    }

    struct Reader<'a> {
        b: &'a [u8],
        i: usize,
    }

    impl<'a> Reader<'a> {
        fn skip_ws(&mut self) {
            while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
                self.i += 1;
            }
        }

        /// The next byte that is not whitespace, consumed.
        fn next(&mut self) -> Option<u8> {
            self.skip_ws();
            let c = *self.b.get(self.i)?;
            self.i += 1;
            Some(c)
        }

        fn expect(&mut self, c: u8) -> Option<()> {
            (self.next()? == c).then_some(())
        }

        /// The bytes of a string without escapes or control characters.
        fn raw(&mut self) -> Option<&'a [u8]> {
            self.expect(b'"')?;
            let start = self.i;
            let len = self.b[start..]
                .iter()
                .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
            if self.b[start + len] != b'"' {
                return None;
            }
            self.i = start + len + 1;
            Some(&self.b[start..start + len])
        }

        /// A string without escapes or control characters (valid UTF-8, as serde_json wants).
        fn string(&mut self) -> Option<&'a str> {
            std::str::from_utf8(self.raw()?).ok()
        }

        /// A key: the string `name` (compared as bytes: no UTF-8 check needed), then `:`.
        fn key(&mut self, name: &[u8]) -> Option<()> {
            (self.raw()? == name).then_some(())?;
            self.expect(b':')
        }

        /// `[item, ...]` with one to `max` items.
        fn list<T>(
            &mut self,
            max: usize,
            mut item: impl FnMut(&mut Self) -> Option<T>,
        ) -> Option<Vec<T>> {
            self.expect(b'[')?;
            let mut out = Vec::with_capacity(1);
            loop {
                if out.len() == max {
                    return None;
                }
                out.push(item(self)?);
                match self.next()? {
                    b',' => continue,
                    b']' => return Some(out),
                    _ => return None,
                }
            }
        }

        /// `{"entries": [...]}`.
        fn descriptor(&mut self, max_entries: usize) -> Option<Descriptor> {
            self.expect(b'{')?;
            self.key(b"entries")?;
            let entries = self.list(max_entries, Reader::entry)?;
            self.expect(b'}')?;
            Some(Descriptor {
                entries,
                hits: None,
                limit: None,
            })
        }

        /// `{"key": "...", "value": "..."}`.
        fn entry(&mut self) -> Option<(String, String)> {
            self.expect(b'{')?;
            self.key(b"key")?;
            let key = self.string()?;
            self.expect(b',')?;
            self.key(b"value")?;
            let value = self.string()?;
            self.expect(b'}')?;
            Some((key.to_owned(), value.to_owned()))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Collecting

/// A field as read.
#[derive(Debug, Clone, Default, PartialEq)]
enum Got<T> {
    /// Absent, or `null`.
    #[default]
    Absent,
    /// The expected kind.
    Is(T),
    /// Anything else, for the error message.
    Other(Value),
}

/// A string or a non-negative integer: what every leaf field of a request is.
#[derive(Debug, Clone, PartialEq)]
enum Scalar {
    U64(u64),
    Str(String),
}

/// What a slot expects. Whatever it does not expect becomes [`Got::Other`] (the defaults).
trait Shape<'de>: Sized {
    type Out;

    /// The limits of the read this value belongs to.
    fn bounds(&self) -> Bounds<'_>;

    fn string(self, s: String) -> Got<Self::Out> {
        Got::Other(Value::String(s))
    }

    fn uint(self, n: u64) -> Got<Self::Out> {
        Got::Other(n.into())
    }

    fn seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Got<Self::Out>, A::Error> {
        Strict(self.bounds()).visit_seq(seq).map(Got::Other)
    }

    fn map<A: MapAccess<'de>>(self, map: A) -> Result<Got<Self::Out>, A::Error> {
        Strict(self.bounds()).visit_map(map).map(Got::Other)
    }
}

/// Any JSON value as a `Value`, read as serde_json's own `Value` reads it except that an
/// object naming a key twice is an error (a `Value` keeps the last).
/// Every element and member it reads spends one of the request's [`MAX_UNREAD`].
struct Strict<'b>(Bounds<'b>);

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(n.into())
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(n.into())
    }

    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element_seed(Strict(self.0))? {
            self.0.spend()?;
            out.push(item);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(duplicate(&key));
            }
            let value = map.next_value_seed(Strict(self.0))?;
            self.0.spend()?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// Reads one JSON value of any kind into a [`Got`] of its shape.
struct Slot<S>(S);

impl<'de, S: Shape<'de>> DeserializeSeed<'de> for Slot<S> {
    type Value = Got<S::Out>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de, S: Shape<'de>> Visitor<'de> for Slot<S> {
    type Value = Got<S::Out>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Got::Absent)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Got::Absent)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok(Got::Other(b.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
        Ok(self.0.uint(n))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
        // serde_json calls this for negative integers only (`-0` is a float); were it given a
        // non-negative one, it is what `visit_u64` would get.
        match u64::try_from(n) {
            Ok(n) => Ok(self.0.uint(n)),
            Err(_) => Ok(Got::Other(n.into())),
        }
    }

    fn visit_f64<E>(self, n: f64) -> Result<Self::Value, E> {
        Ok(Got::Other(n.into()))
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(self.0.string(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(self.0.string(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.0.seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.map(map)
    }
}

/// A leaf field: [`Scalar`].
#[derive(Clone, Copy)]
struct Leaf<'b>(Bounds<'b>);

impl<'de> Shape<'de> for Leaf<'_> {
    type Out = Scalar;

    fn bounds(&self) -> Bounds<'_> {
        self.0
    }

    fn string(self, s: String) -> Got<Scalar> {
        Got::Is(Scalar::Str(s))
    }

    fn uint(self, n: u64) -> Got<Scalar> {
        Got::Is(Scalar::U64(n))
    }
}

/// An array whose elements have shape `S`, at most `max` of them: reading stops at the next
/// one with `over` recorded in `bounds`.
#[derive(Clone, Copy)]
struct List<'b, S> {
    item: S,
    max: usize,
    over: Over,
    bounds: Bounds<'b>,
}

impl<'de, S: Shape<'de> + Copy> Shape<'de> for List<'_, S> {
    type Out = Vec<Got<S::Out>>;

    fn bounds(&self) -> Bounds<'_> {
        self.bounds
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Got<Self::Out>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(1).min(self.max).min(64));
        loop {
            if out.len() == self.max {
                // One more is refused where it starts: `Stop` reads nothing of it.
                return match seq.next_element_seed(Stop) {
                    Ok(None) => Ok(Got::Is(out)),
                    Ok(Some(())) | Err(_) => {
                        self.bounds.over.set(Some(self.over));
                        Err(serde::de::Error::custom("count limit"))
                    }
                };
            }
            match seq.next_element_seed(Slot(self.item)) {
                Ok(Some(item)) => out.push(item),
                Ok(None) => return Ok(Got::Is(out)),
                Err(e) => {
                    // An inner list over its limit: name the element it is in.
                    if self.over == Over::Descriptors
                        && self.bounds.over.get() == Some(Over::Entries(usize::MAX))
                    {
                        self.bounds.over.set(Some(Over::Entries(out.len())));
                    }
                    return Err(e);
                }
            }
        }
    }
}

/// An element that is not to be read: refused before any of it is.
struct Stop;

impl<'de> DeserializeSeed<'de> for Stop {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, _: D) -> Result<(), D::Error> {
        Err(serde::de::Error::custom("count limit"))
    }
}

/// The fields of one kind of JSON object that a request reads.
trait Object: Default {
    /// The keys read, in the order of [`Object::read`]'s index (at most 32).
    const KEYS: &'static [&'static str];
    /// Read the value of `KEYS[key]` (once per object: a duplicate is an error before).
    fn read<'de, A: MapAccess<'de>>(
        &mut self,
        key: usize,
        map: &mut A,
        bounds: Bounds<'_>,
    ) -> Result<(), A::Error>;
}

/// An object of kind `O`.
struct Fields<'b, O>(PhantomData<O>, Bounds<'b>);

impl<O> Clone for Fields<'_, O> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<O> Copy for Fields<'_, O> {}

impl<'de, O: Object> Shape<'de> for Fields<'_, O> {
    type Out = O;

    fn bounds(&self) -> Bounds<'_> {
        self.1
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Got<O>, A::Error> {
        let mut out = O::default();
        // Known keys seen so far, one bit per index; unknown ones (rare) in a set made at the
        // first.
        let mut seen = 0u32;
        let mut unknown: Option<BTreeSet<String>> = None;
        while let Some(key) = map.next_key_seed(KeyIndex(O::KEYS))? {
            match key {
                Key::Known(i) => {
                    if seen & (1 << i) != 0 {
                        return Err(duplicate(O::KEYS[i]));
                    }
                    seen |= 1 << i;
                    out.read(i, &mut map, self.1)?;
                }
                Key::Unknown(name) => {
                    let set = unknown.get_or_insert_with(BTreeSet::new);
                    if set.contains(&name) {
                        return Err(duplicate(&name));
                    }
                    map.next_value_seed(Strict(self.1))?;
                    set.insert(name);
                }
            }
        }
        Ok(Got::Is(out))
    }
}

/// An object key as [`KeyIndex`] reads it.
enum Key {
    /// The index of a known key.
    Known(usize),
    /// Any other key, kept to tell a duplicate.
    Unknown(String),
}

/// A map key as its index in a list of known keys, without allocating; or an unknown key.
struct KeyIndex(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for KeyIndex {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIndex {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(match self.0.iter().position(|k| *k == key) {
            Some(i) => Key::Known(i),
            None => Key::Unknown(key.to_owned()),
        })
    }
}

fn next<'de, A: MapAccess<'de>, S: Shape<'de>>(
    map: &mut A,
    shape: S,
) -> Result<Got<S::Out>, A::Error> {
    map.next_value_seed(Slot(shape))
}

/// Declares one kind of request object: a struct of [`Got`] fields and its [`Object`] impl, which
/// reads each field from its key with the shape given (`|b|` names the read's [`Bounds`]).
/// `KEYS` lists the keys in the order of the fields.
macro_rules! raw_object {
    ($(#[$doc:meta])* $name:ident |$b:ident| {
        $($field:ident: $ty:ty = $key:literal => $shape:expr,)+
    }) => {
        $(#[$doc])*
        #[derive(Debug, Default, PartialEq)]
        struct $name {
            $($field: Got<$ty>,)+
        }

        impl Object for $name {
            const KEYS: &'static [&'static str] = &[$($key),+];

            fn read<'de, A: MapAccess<'de>>(
                &mut self,
                key: usize,
                map: &mut A,
                $b: Bounds<'_>,
            ) -> Result<(), A::Error> {
                // The fields by their index in `KEYS`: the comparisons are of constants.
                #[allow(non_camel_case_types)]
                enum Field {
                    $($field),+
                }
                $(
                    if key == Field::$field as usize {
                        self.$field = next(map, $shape)?;
                    } else
                )+ {
                    // `KeyIndex` gives indices into `KEYS` only.
                }
                Ok(())
            }
        }
    };
}

raw_object! {
    /// The request object.
    RawBody |b| {
        domain: Scalar = "domain" => Leaf(b),
        hits: Scalar = "hits_addend" => Leaf(b),
        hits_camel: Scalar = "hitsAddend" => Leaf(b),
        descriptors: Vec<Got<RawDescriptor>> = "descriptors"
            => b.list(b.descriptors, Over::Descriptors),
    }
}

raw_object! {
    /// One element of `descriptors`.
    RawDescriptor |b| {
        entries: Vec<Got<RawEntry>> = "entries" => b.list(b.entries, Over::Entries(usize::MAX)),
        hits: Scalar = "hits_addend" => Leaf(b),
        hits_camel: Scalar = "hitsAddend" => Leaf(b),
        limit: RawLimit = "limit" => Fields(PhantomData, b),
    }
}

raw_object! {
    /// One element of a descriptor's `entries`.
    RawEntry |b| {
        key: Scalar = "key" => Leaf(b),
        value: Scalar = "value" => Leaf(b),
    }
}

raw_object! {
    /// A descriptor's `limit`.
    RawLimit |b| {
        requests_per_unit: Scalar = "requests_per_unit" => Leaf(b),
        requests_per_unit_camel: Scalar = "requestsPerUnit" => Leaf(b),
        unit: Scalar = "unit" => Leaf(b),
    }
}

// ---------------------------------------------------------------------------------------------
// Assembling

impl Got<Scalar> {
    /// The value as JSON, for an error message.
    fn shown(&self) -> Value {
        match self {
            Got::Absent => Value::Null,
            Got::Is(Scalar::U64(n)) => (*n).into(),
            Got::Is(Scalar::Str(s)) => Value::String(s.clone()),
            Got::Other(v) => v.clone(),
        }
    }
}

/// A field spelt in snake_case, or (protojson only) in camelCase. In protojson both names are
/// the one field, so giving both is a duplicate (`what` names the field in the error, e.g.
/// `descriptors[0].`, `hits_addend`, `hitsAddend`); a `null` counts as absent.
fn pick<T>(
    snake: Got<T>,
    camel: Got<T>,
    d: Dialect,
    what: impl FnOnce() -> (String, &'static str, &'static str),
) -> Result<Got<T>, ApiError> {
    if d == Dialect::Native {
        return Ok(snake);
    }
    match (snake, camel) {
        (Got::Absent, camel) => Ok(camel),
        (snake, Got::Absent) => Ok(snake),
        _ => {
            let (at, snake, camel) = what();
            Err(ApiError::invalid(
                DUPLICATE_KEY,
                format!("duplicate key: `{at}{snake}` and `{at}{camel}` are the same field"),
            ))
        }
    }
}

/// A count: a JSON number (protojson: or a decimal string); `what` names it in the error.
fn hits_value(v: &Got<Scalar>, what: impl FnOnce() -> String, d: Dialect) -> Result<u64, ApiError> {
    let bad = || {
        ApiError::invalid(
            "invalid_hits",
            format!(
                "`{}` must be a non-negative integer, got {}",
                what(),
                v.shown()
            ),
        )
    };
    match v {
        Got::Is(Scalar::U64(n)) => Ok(*n),
        // Decimal digits only (as Go's protojson): `u64::from_str` would also take a `+`.
        Got::Is(Scalar::Str(s))
            if d == Dialect::ProtoJson
                && !s.is_empty()
                && s.bytes().all(|b| b.is_ascii_digit()) =>
        {
            s.parse::<u64>().map_err(|_| bad())
        }
        _ => Err(bad()),
    }
}

/// An optional `hits_addend` (protojson: or `hitsAddend`); `at` prefixes its name in errors
/// (`""` or `"descriptors[i]."`).
fn hits(
    snake: Got<Scalar>,
    camel: Got<Scalar>,
    at: impl Fn() -> String,
    d: Dialect,
) -> Result<Option<u64>, ApiError> {
    match pick(snake, camel, d, || (at(), "hits_addend", "hitsAddend"))? {
        Got::Absent => Ok(None),
        v => hits_value(&v, || format!("{}hits_addend", at()), d).map(Some),
    }
}

/// A descriptor's optional `limit` override: `{"requests_per_unit": N, "unit": "minute"}`
/// (protojson: `requestsPerUnit`, and `unit` as Envoy's enum name such as `"MINUTE"` or its
/// number).
fn limit_override(
    v: Got<RawLimit>,
    i: usize,
    d: Dialect,
) -> Result<Option<LimitOverride>, ApiError> {
    let bad = |m: String| ApiError::invalid("invalid_limit", format!("descriptors[{i}].limit{m}"));
    let raw = match v {
        Got::Absent => return Ok(None),
        Got::Is(raw) => raw,
        Got::Other(v) => return Err(bad(format!(" must be an object, got {v}"))),
    };
    let names = || {
        (
            format!("descriptors[{i}].limit."),
            "requests_per_unit",
            "requestsPerUnit",
        )
    };
    let requests_per_unit =
        match pick(raw.requests_per_unit, raw.requests_per_unit_camel, d, names)? {
            // proto3: an absent number is 0.
            Got::Absent if d == Dialect::ProtoJson => 0,
            Got::Absent => return Err(bad(".requests_per_unit is missing".into())),
            n => hits_value(&n, String::new, d).map_err(|_| {
                bad(format!(
                    ".requests_per_unit must be a non-negative integer, got {}",
                    n.shown()
                ))
            })?,
        };
    let unit = match raw.unit {
        Got::Is(Scalar::Str(s)) => s.parse().map_err(|e| bad(format!(".unit: {e}")))?,
        Got::Is(Scalar::U64(n)) if d == Dialect::ProtoJson => i32::try_from(n)
            .ok()
            .and_then(unit_from_number)
            .ok_or_else(|| bad(format!(".unit: unknown unit number {n}")))?,
        Got::Other(Value::Number(n)) if d == Dialect::ProtoJson => {
            return Err(bad(format!(".unit: unknown unit number {n}")))
        }
        Got::Absent => return Err(bad(".unit is missing".into())),
        other => {
            return Err(bad(format!(
                ".unit must be a unit name, got {}",
                other.shown()
            )))
        }
    };
    Ok(Some(LimitOverride {
        requests_per_unit,
        unit,
    }))
}

fn invalid(message: String) -> ApiError {
    ApiError::invalid("invalid_request", message)
}

/// Check the collected fields in a fixed order and build the request. The first mistake is
/// reported: the request's own fields, then each descriptor in order.
fn assemble(body: Got<RawBody>, d: Dialect) -> Result<CheckRequest, ApiError> {
    let Got::Is(body) = body else {
        return Err(invalid("the body must be a JSON object".into()));
    };
    let domain = match body.domain {
        Got::Absent => String::new(),
        Got::Is(Scalar::Str(s)) => s,
        other => {
            return Err(invalid(format!(
                "`domain` must be a string, got {}",
                other.shown()
            )))
        }
    };
    let hits = hits(body.hits, body.hits_camel, String::new, d)?
        // protojson (as Envoy): a request `hitsAddend` of 0 means 1.
        .filter(|&h| !(d == Dialect::ProtoJson && h == 0));
    let list = match body.descriptors {
        Got::Absent => Vec::new(),
        Got::Is(list) => list,
        Got::Other(v) => return Err(invalid(format!("`descriptors` must be an array, got {v}"))),
    };
    let descriptors = each(list, |i, raw| descriptor(raw, i, d))?;
    Ok(CheckRequest {
        domain,
        descriptors,
        hits,
    })
}

/// `f(index, item)` over `list`, stopping at the first error. Not `collect::<Result<Vec<_>>>`:
/// that reuses `list`'s allocation in place and then shrinks it with a `realloc` per request.
fn each<T, U>(
    list: Vec<T>,
    mut f: impl FnMut(usize, T) -> Result<U, ApiError>,
) -> Result<Vec<U>, ApiError> {
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.into_iter().enumerate() {
        out.push(f(i, item)?);
    }
    Ok(out)
}

/// `descriptors[i]`: its entries, then its own hits, then its limit.
fn descriptor(raw: Got<RawDescriptor>, i: usize, d: Dialect) -> Result<Descriptor, ApiError> {
    let Got::Is(raw) = raw else {
        return Err(invalid(format!("descriptors[{i}] must be an object")));
    };
    let entries = match raw.entries {
        Got::Absent => Vec::new(),
        Got::Is(entries) => entries,
        Got::Other(_) => {
            return Err(invalid(format!(
                "descriptors[{i}].entries must be an array"
            )))
        }
    };
    Ok(Descriptor {
        entries: each(entries, |j, raw| entry(raw, i, j))?,
        hits: hits(raw.hits, raw.hits_camel, || format!("descriptors[{i}]."), d)?,
        limit: limit_override(raw.limit, i, d)?,
    })
}

/// `descriptors[i].entries[j]`: a key (required) and a value (absent or null: empty).
fn entry(raw: Got<RawEntry>, i: usize, j: usize) -> Result<(String, String), ApiError> {
    let Got::Is(raw) = raw else {
        return Err(invalid(format!(
            "descriptors[{i}].entries[{j}] must be an object"
        )));
    };
    let key = match raw.key {
        Got::Is(Scalar::Str(s)) => s,
        Got::Absent => {
            return Err(ApiError::invalid(
                "invalid_entry",
                format!("descriptors[{i}].entries[{j}].key is missing"),
            ))
        }
        _ => {
            return Err(invalid(format!(
                "descriptors[{i}].entries[{j}].key must be a string"
            )))
        }
    };
    let value = match raw.value {
        Got::Is(Scalar::Str(s)) => s,
        Got::Absent => String::new(),
        _ => {
            return Err(invalid(format!(
                "descriptors[{i}].entries[{j}].value must be a string"
            )))
        }
    };
    Ok((key, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader without count limits.
    fn collect(body: &[u8]) -> Result<Got<RawBody>, serde_json::Error> {
        let (over, unread) = (Cell::new(None), Cell::new(usize::MAX));
        let bounds = Bounds {
            descriptors: usize::MAX,
            entries: usize::MAX,
            over: &over,
            unread: &unread,
        };
        super::collect(body, bounds)
    }

    #[test]
    fn unread_fields_are_bounded() {
        let body = |n: usize| {
            format!(
                r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","x":[{}]}}]}}],"y":{{}}}}"#,
                vec!["{}"; n].join(",")
            )
        };
        for d in [Dialect::Native, Dialect::ProtoJson] {
            assert!(parse_request(body(MAX_UNREAD).as_bytes(), d).is_ok());
            let e = parse_request(body(MAX_UNREAD + 1).as_bytes(), d).unwrap_err();
            assert_eq!(e.code(), "invalid_request");
            assert!(e.to_string().contains("more than 1024 values"), "{e}");
        }
    }

    #[test]
    fn counts_are_refused_at_the_limit_naming_it() {
        let entry = r#"{"key":"k","value":"v"}"#;
        let desc = |n: usize| format!(r#"{{"entries":[{}]}}"#, vec![entry; n].join(","));
        // Plain bodies, and bodies the general reader takes (a `hits_addend`).
        for extra in ["", r#""hits_addend":1,"#] {
            let body = |descs: Vec<String>| {
                format!(
                    r#"{{{extra}"domain":"d","descriptors":[{}]}}"#,
                    descs.join(",")
                )
            };
            for d in [Dialect::Native, Dialect::ProtoJson] {
                let ok = parse_request(body(vec![desc(16); 64]).as_bytes(), d).unwrap();
                assert_eq!(ok.descriptors.len(), 64);
                // The rest is never read: not even whether it is JSON.
                let many = body(vec![desc(1); 65]).replace("]}]}", "]}, not json");
                let e = parse_request(many.as_bytes(), d).unwrap_err();
                assert_eq!(e.code(), "too_many_descriptors", "{e}");
                assert_eq!(e.to_string(), "more than the maximum 64 descriptors");
                let mut descs = vec![desc(1); 3];
                descs[2] = desc(17);
                let e = parse_request(body(descs).as_bytes(), d).unwrap_err();
                assert_eq!(e.code(), "too_many_entries", "{e}");
                assert_eq!(
                    e.to_string(),
                    "descriptors[2] has more than the maximum 16 entries"
                );
            }
        }
    }
    use proptest::prelude::*;

    /// JSON text of one leaf: the kinds and edge cases a request field can get.
    fn leaf() -> impl Strategy<Value = String> + Clone {
        prop::sample::select(vec![
            r#""a""#,
            r#""""#,
            r#""user_1""#,
            "5",
            "0",
            "-0",
            "-1",
            "1.5",
            "1.0",
            "1e3",
            "18446744073709551615",
            "18446744073709551616",
            "4294967296",
            r#""7""#,
            r#""+5""#,
            r#""-1""#,
            r#""MINUTE""#,
            r#""minute""#,
            r#""fortnight""#,
            "2",
            "7",
            "null",
            "true",
            "[]",
            "{}",
            r#"[1,"a"]"#,
            r#"{"b":1,"a":[null]}"#,
            r#""\u00e9\n""#,
            r#""\ud800""#,
        ])
        .prop_map(str::to_string)
    }

    /// A JSON object from `(key, value text)` pairs (keys may repeat).
    fn object(fields: Vec<(&'static str, String)>) -> String {
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}", body.join(","))
    }

    /// An object with up to 4 of `keys` (repeats allowed), each with a value of its strategy.
    fn fields(keys: Vec<(&'static str, BoxedStrategy<String>)>) -> BoxedStrategy<String> {
        let one = prop::strategy::Union::new(
            keys.into_iter()
                .map(|(k, v)| v.prop_map(move |v| (k, v)).boxed()),
        );
        prop::collection::vec(one, 0..5).prop_map(object).boxed()
    }

    /// Mostly `typed`, sometimes any leaf.
    fn or_leaf(typed: BoxedStrategy<String>) -> BoxedStrategy<String> {
        prop_oneof![4 => typed, 1 => leaf()].boxed()
    }

    fn array(item: BoxedStrategy<String>) -> BoxedStrategy<String> {
        prop::collection::vec(item, 0..4)
            .prop_map(|v| format!("[{}]", v.join(",")))
            .boxed()
    }

    /// Request-shaped JSON text with wrong kinds, nulls, duplicates, both spellings, unknown
    /// keys; sometimes cut short, followed by garbage or holding a byte that is not UTF-8.
    fn body() -> impl Strategy<Value = Vec<u8>> {
        let leaf = || leaf().boxed();
        // Mostly one of `good` (so that later fields get checked too), sometimes any leaf.
        let mostly = |good: &[&'static str]| {
            let good: Vec<String> = good.iter().map(|s| s.to_string()).collect();
            prop_oneof![3 => prop::sample::select(good), 1 => leaf()].boxed()
        };
        let count = || mostly(&["0", "1", "5", r#""7""#]);
        let text = || mostly(&[r#""a""#, r#""b""#]);
        let limit = or_leaf(fields(vec![
            ("requests_per_unit", count()),
            ("requestsPerUnit", count()),
            ("unit", mostly(&[r#""minute""#, r#""HOUR""#, "2", "9"])),
            ("x", leaf()),
        ]));
        let entry = or_leaf(fields(vec![
            ("key", text()),
            ("value", text()),
            ("x", leaf()),
        ]));
        let descriptor = or_leaf(fields(vec![
            ("entries", or_leaf(array(entry))),
            ("hits_addend", count()),
            ("hitsAddend", count()),
            ("limit", limit),
            ("x", leaf()),
        ]));
        let body = or_leaf(fields(vec![
            ("domain", text()),
            ("hits_addend", count()),
            ("hitsAddend", count()),
            ("descriptors", or_leaf(array(descriptor))),
            ("x", leaf()),
        ]));
        (body, 0..12usize, any::<usize>()).prop_map(|(text, damage, at)| {
            let mut bytes = text.into_bytes();
            match damage {
                0 => bytes.truncate(at % (bytes.len() + 1)),
                1 => bytes.extend_from_slice(b" x"),
                2 => bytes.insert(at % (bytes.len() + 1), 0xff),
                _ => {}
            }
            bytes
        })
    }

    /// What [`collect`] must read: the same fields looked up in a `serde_json::Value` tree
    /// (the previous implementation's first step, and the obvious reading of the JSON).
    fn collect_via_value(v: &Value) -> Got<RawBody> {
        fn got<T>(v: Option<&Value>, typed: impl FnOnce(&Value) -> Option<T>) -> Got<T> {
            match v {
                None | Some(Value::Null) => Got::Absent,
                Some(v) => typed(v).map_or_else(|| Got::Other(v.clone()), Got::Is),
            }
        }
        fn leaf(v: Option<&Value>) -> Got<Scalar> {
            got(v, |v| match v {
                Value::String(s) => Some(Scalar::Str(s.clone())),
                Value::Number(n) => n.as_u64().map(Scalar::U64),
                _ => None,
            })
        }
        fn list<T>(v: Option<&Value>, item: impl Fn(&Value) -> Got<T>) -> Got<Vec<Got<T>>> {
            got(v, |v| v.as_array().map(|a| a.iter().map(item).collect()))
        }
        fn object<T>(
            v: Option<&Value>,
            read: impl FnOnce(&serde_json::Map<String, Value>) -> T,
        ) -> Got<T> {
            got(v, |v| v.as_object().map(read))
        }
        object(Some(v), |o| RawBody {
            domain: leaf(o.get("domain")),
            hits: leaf(o.get("hits_addend")),
            hits_camel: leaf(o.get("hitsAddend")),
            descriptors: list(o.get("descriptors"), |d| {
                object(Some(d), |o| RawDescriptor {
                    entries: list(o.get("entries"), |e| {
                        object(Some(e), |o| RawEntry {
                            key: leaf(o.get("key")),
                            value: leaf(o.get("value")),
                        })
                    }),
                    hits: leaf(o.get("hits_addend")),
                    hits_camel: leaf(o.get("hitsAddend")),
                    limit: object(o.get("limit"), |o| RawLimit {
                        requests_per_unit: leaf(o.get("requests_per_unit")),
                        requests_per_unit_camel: leaf(o.get("requestsPerUnit")),
                        unit: leaf(o.get("unit")),
                    }),
                })
            }),
        })
    }

    /// A JSON document with every object's keys kept in order, duplicates included (what a
    /// `Value` cannot show).
    enum Tree {
        Leaf(Value),
        Array(Vec<Tree>),
        Object(Vec<(String, Tree)>),
    }

    impl<'de> serde::Deserialize<'de> for Tree {
        fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Tree;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("JSON")
                }
                fn visit_unit<E>(self) -> Result<Tree, E> {
                    Ok(Tree::Leaf(Value::Null))
                }
                fn visit_bool<E>(self, b: bool) -> Result<Tree, E> {
                    Ok(Tree::Leaf(b.into()))
                }
                fn visit_u64<E>(self, n: u64) -> Result<Tree, E> {
                    Ok(Tree::Leaf(n.into()))
                }
                fn visit_i64<E>(self, n: i64) -> Result<Tree, E> {
                    Ok(Tree::Leaf(n.into()))
                }
                fn visit_f64<E>(self, n: f64) -> Result<Tree, E> {
                    Ok(Tree::Leaf(n.into()))
                }
                fn visit_str<E>(self, s: &str) -> Result<Tree, E> {
                    Ok(Tree::Leaf(s.into()))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
                    let mut out = Vec::new();
                    while let Some(t) = seq.next_element()? {
                        out.push(t);
                    }
                    Ok(Tree::Array(out))
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
                    let mut out = Vec::new();
                    while let Some(kv) = map.next_entry()? {
                        out.push(kv);
                    }
                    Ok(Tree::Object(out))
                }
            }
            de.deserialize_any(V)
        }
    }

    impl Tree {
        /// The first key that repeats in its object, in reading order.
        fn first_duplicate(&self) -> Option<&str> {
            match self {
                Tree::Leaf(_) => None,
                Tree::Array(items) => items.iter().find_map(Tree::first_duplicate),
                Tree::Object(fields) => fields.iter().enumerate().find_map(|(i, (k, v))| {
                    if fields[..i].iter().any(|(seen, _)| seen == k) {
                        Some(k.as_str())
                    } else {
                        v.first_duplicate()
                    }
                }),
            }
        }

        fn value(&self) -> Value {
            match self {
                Tree::Leaf(v) => v.clone(),
                Tree::Array(items) => items.iter().map(Tree::value).collect(),
                Tree::Object(fields) => {
                    fields.iter().map(|(k, v)| (k.clone(), v.value())).collect()
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// One pass reads what a `Value` tree holds (kinds, nulls, unknown keys) and exactly the
        /// same JSON syntax errors, except that the first key repeated in an object, at any
        /// depth, is an error naming it, raised where it is read (before any later syntax error).
        #[test]
        fn reads_what_a_value_tree_holds(bytes in body()) {
            let text = String::from_utf8_lossy(&bytes);
            let got = collect(&bytes);
            match serde_json::from_slice::<Tree>(&bytes) {
                Ok(tree) => match tree.first_duplicate() {
                    Some(key) => {
                        let e = got.expect_err("a duplicate key is an error");
                        prop_assert_eq!(e.classify(), serde_json::error::Category::Data);
                        let want = format!("duplicate key `{key}` at ");
                        prop_assert!(e.to_string().starts_with(&want), "{} in {}", e, text);
                    }
                    None => prop_assert_eq!(
                        got.map_err(|e| e.to_string()),
                        Ok(collect_via_value(&tree.value())),
                        "{}", text
                    ),
                },
                Err(syntax) => {
                    let e = got.expect_err("invalid JSON is an error");
                    if e.classify() == serde_json::error::Category::Data {
                        // A duplicate read before the syntax error.
                        prop_assert!(e.column() <= syntax.column(), "{} / {} in {}", e, syntax, text);
                        prop_assert!(e.to_string().starts_with("duplicate key `"), "{}", e);
                    } else {
                        prop_assert_eq!(e.to_string(), syntax.to_string(), "{}", text);
                    }
                }
            }
        }
    }

    /// Text in the neighbourhood of the plain shape: its pieces, whitespace, escapes, control
    /// characters, unknown and repeated keys, truncation.
    fn near_plain() -> impl Strategy<Value = Vec<u8>> {
        let string = prop::sample::select(vec![
            r#""a""#,
            r#""""#,
            r#""user_1""#,
            r#""é☃""#,
            r#""a\"b""#,
            r#""\u0041""#,
            "\"a\tb\"",
            "\"a\u{1}\"",
            r#""domain""#,
            r#""key""#,
            r#""value""#,
            r#""entries""#,
            r#""descriptors""#,
        ]);
        let ws = prop::sample::select(vec!["", " ", "\n  ", "\t", "\r\n"]);
        let entry = (string.clone(), string.clone(), ws.clone())
            .prop_map(|(k, v, w)| format!(r#"{{{w}"key"{w}:{w}{k}{w},{w}"value":{v}{w}}}"#));
        let entries = prop::collection::vec(entry, 0..3).prop_map(|e| e.join(","));
        let extra = prop::sample::select(vec![
            "",
            r#","hits_addend":2"#,
            r#","entries":[]"#,
            r#","x":1"#,
        ]);
        let descriptor = (entries, extra.clone(), ws.clone())
            .prop_map(|(e, x, w)| format!(r#"{{{w}"entries"{w}:{w}[{e}]{x}{w}}}"#));
        let descriptors = prop::collection::vec(descriptor, 0..3).prop_map(|d| d.join(", "));
        let top = prop::sample::select(vec![
            "",
            r#","domain":"x""#,
            r#","hits_addend":1"#,
            r#","descriptors":[]"#,
            r#","y":null"#,
        ]);
        (
            string,
            descriptors,
            top,
            any::<bool>(),
            ws,
            prop::option::of(0usize..120),
        )
            .prop_map(|(domain, descriptors, top, swap, w, cut)| {
                let d = format!(r#""domain"{w}:{w}{domain}"#);
                let l = format!(r#""descriptors":[{descriptors}]"#);
                let (a, b) = if swap { (l, d) } else { (d, l) };
                let mut text = format!("{w}{{{a},{w}{b}{top}}}{w}").into_bytes();
                if let Some(n) = cut {
                    text.truncate(n);
                }
                text
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// The plain reader never answers differently from the general one: whatever it reads
        /// is what `parse_request`'s serde reader makes of the same body, in both dialects.
        #[test]
        fn the_plain_reader_agrees_with_the_general_one(bytes in near_plain()) {
            if let Some(req) = plain::read(&bytes, usize::MAX, usize::MAX) {
                let text = String::from_utf8_lossy(&bytes);
                for d in [Dialect::Native, Dialect::ProtoJson] {
                    let general = assemble(collect(&bytes).expect("valid JSON"), d);
                    prop_assert_eq!(general.as_ref().ok(), Some(&req), "{}", text);
                }
            }
        }
    }

    #[test]
    fn the_common_bodies_take_the_plain_path() {
        for body in [
            r#"{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"user_42"}]}]}"#,
            "{ \"domain\": \"api\", \"descriptors\": [ { \"entries\": [ { \"key\": \"a\", \"value\": \"1\" }, { \"key\": \"b\", \"value\": \"é\" } ] } ] }\n",
            r#"{"descriptors":[{"entries":[{"key":"k","value":""}]},{"entries":[{"key":"k","value":"v"}]}],"domain":"d"}"#,
        ] {
            let req = plain::read(body.as_bytes(), usize::MAX, usize::MAX).unwrap_or_else(|| panic!("{body}"));
            let general = assemble(collect(body.as_bytes()).unwrap(), Dialect::Native).unwrap();
            assert_eq!(req, general);
        }
        for body in [
            r#"{"domain":"a","domain":"b","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#,
            r#"{"domain":"a\u0041","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#,
            r#"{"domain":"a","descriptors":[{"entries":[{"value":"v","key":"k"}]}]}"#,
            r#"{"domain":"a","descriptors":[{"entries":[{"key":"k","value":"v"}]}]} x"#,
            r#"{"domain":"a","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"hits_addend":2}"#,
        ] {
            assert_eq!(
                plain::read(body.as_bytes(), usize::MAX, usize::MAX),
                None,
                "{body}"
            );
        }
    }

    #[test]
    fn the_first_mistake_in_a_fixed_order_whatever_the_key_order() {
        let err = |body: &str, d| parse_request(body.as_bytes(), d).unwrap_err().to_string();
        for body in [
            r#"{"descriptors": 5, "domain": 7}"#,
            r#"{"domain": 7, "descriptors": 5}"#,
        ] {
            assert_eq!(
                err(body, Dialect::Native),
                "`domain` must be a string, got 7"
            );
        }
        let limit = r#"{"domain": "d", "descriptors": [{"limit": {"unit": 9, "requestsPerUnit": -2},
            "entries": [{"key": "k"}]}]}"#;
        assert_eq!(
            err(limit, Dialect::Native),
            "descriptors[0].limit.requests_per_unit is missing"
        );
        assert_eq!(
            err(limit, Dialect::ProtoJson),
            "descriptors[0].limit.requests_per_unit must be a non-negative integer, got -2"
        );
        assert_eq!(
            err(r#"{"domain": "a", "domain": ["b"]}"#, Dialect::Native),
            "duplicate key `domain` at line 1 column 24"
        );
        // Unknown keys are skipped, but their JSON is checked as strictly as the rest.
        let lone = err(r#"{"domain": "a", "x": "\ud800"}"#, Dialect::Native);
        assert!(lone.starts_with("body is not valid JSON: "), "{lone}");
    }

    #[test]
    fn duplicate_keys_at_any_depth_name_the_key() {
        let fails = |body: &str, d| {
            let e = parse_request(body.as_bytes(), d).unwrap_err();
            assert_eq!(e.code(), "duplicate_key", "{body}: {e}");
            e.to_string()
        };
        let native = Dialect::Native;
        for (body, key) in [
            (r#"{"domain":"nope","domain":"api"}"#, "domain"),
            (r#"{"dom\u0061in":"nope","domain":"api"}"#, "domain"),
            (r#"{"x":1,"x":1}"#, "x"),
            (r#"{"x":{"a":[{"b":1,"b":2}]}}"#, "b"),
            (r#"{"domain":{"a":1,"a":1}}"#, "a"),
            (
                r#"{"descriptors":[{"entries":[{"key":"k","key":"k"}]}]}"#,
                "key",
            ),
            (
                r#"{"descriptors":[{"limit":{"unit":"minute","unit":"hour"}}]}"#,
                "unit",
            ),
            (
                r#"{"descriptors":[{"entries":[],"entries":[]}]}"#,
                "entries",
            ),
        ] {
            let m = fails(body, native);
            assert!(m.starts_with(&format!("duplicate key `{key}` at ")), "{m}");
        }
        // Two spellings of one protojson field; in /v1/check camelCase is an unknown key.
        let m = fails(
            r#"{"domain":"d","hits_addend":1,"hitsAddend":2}"#,
            Dialect::ProtoJson,
        );
        assert_eq!(
            m,
            "duplicate key: `hits_addend` and `hitsAddend` are the same field"
        );
        let both = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k"}],
            "limit":{"unit":"MINUTE","requests_per_unit":1,"requestsPerUnit":2}}]}"#;
        let m = fails(both, Dialect::ProtoJson);
        assert!(m.contains("`descriptors[0].limit.requestsPerUnit`"), "{m}");
        assert!(parse_request(both.as_bytes(), native).is_ok());
        // The same key in two objects is no duplicate.
        let ok =
            r#"{"domain":"d","x":{"k":1},"descriptors":[{"entries":[{"key":"k"},{"key":"k"}]}]}"#;
        assert!(parse_request(ok.as_bytes(), native).is_ok());
    }

    #[test]
    fn both_spellings_and_proto_defaults() {
        let body = r#"{"domain": "d", "hitsAddend": "0", "descriptors": [
            {"entries": [{"key": "k", "value": null}], "hitsAddend": "3",
             "limit": {"requestsPerUnit": "10", "unit": 4}}]}"#;
        let req = parse_request(body.as_bytes(), Dialect::ProtoJson).unwrap();
        assert_eq!(req.hits, None, "protojson hitsAddend 0 means 1");
        let d = &req.descriptors[0];
        assert_eq!(d.entries, vec![("k".to_string(), String::new())]);
        assert_eq!(d.hits, Some(3));
        let limit = d.limit.unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (10, tollgate_core::quota::Unit::Day)
        );
        // Native: camelCase is unknown, strings are not numbers.
        let req = parse_request(body.as_bytes(), Dialect::Native);
        assert_eq!(req.unwrap_err().code(), "invalid_limit");
    }
}
