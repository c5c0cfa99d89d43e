//! The canonical JSON form behind [`Fingerprint::of_json`]: object keys
//! sorted at every depth, no whitespace, written in one pass where it can
//! be and through [`serde_json::Value`] where it cannot.

use std::cell::RefCell;
use std::io;

use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};
use serde_json::Value;

use crate::Fingerprint;

/// The fingerprint of `body`'s canonical form (see
/// [`Fingerprint::of_json`]).
pub(crate) fn fingerprint<T: Serialize + ?Sized>(
    body: &T,
) -> Result<Fingerprint, serde_json::Error> {
    BUFFERS.with(|buffers| match buffers.try_borrow_mut() {
        Ok(mut buffers) => buffers.fingerprint(body),
        // A body whose `Serialize` fingerprints another body.
        Err(_) => Buffers::default().fingerprint(body),
    })
}

thread_local! {
    /// Each thread's buffers for [`Fingerprint::of_json`], kept between
    /// calls so that hashing a body allocates nothing once they have grown.
    static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
}

/// Buffers larger than this are let go after the call that grew them.
const KEPT_BYTES: usize = 64 * 1024;

#[derive(Default)]
struct Buffers {
    /// The canonical form.
    out: Vec<u8>,
    /// The open objects, outermost first.
    objects: Vec<Object>,
    /// The entries of the open objects, each object's after its parent's.
    entries: Vec<Entry>,
    /// An object's entries in key order, each with where it ends.
    order: Vec<(Entry, usize)>,
    /// Room to rewrite an object in order.
    scratch: Vec<u8>,
}

impl Buffers {
    fn fingerprint<T: Serialize + ?Sized>(
        &mut self,
        body: &T,
    ) -> Result<Fingerprint, serde_json::Error> {
        if !self.write_in_one_pass(body) {
            self.out.clear();
            write_canonical(&mut self.out, &serde_json::to_value(body)?)?;
        }
        let fingerprint = Fingerprint::of_bytes(&self.out);
        if self.out.capacity() > KEPT_BYTES || self.scratch.capacity() > KEPT_BYTES {
            *self = Buffers::default();
        }
        Ok(fingerprint)
    }

    /// Writes the canonical form of `body` into `out` in one pass and
    /// reports whether it could; `false` (with `out` holding a partial
    /// write) when the `serde_json::Value` path must decide.
    fn write_in_one_pass<T: Serialize + ?Sized>(&mut self, body: &T) -> bool {
        self.out.clear();
        self.objects.clear();
        self.entries.clear();
        let mut canonical = Canonical {
            buffers: self,
            in_key: false,
        };
        // Every byte goes to `out` through the formatter; the serializer's
        // own writer is never written to.
        let mut serializer = serde_json::Serializer::with_formatter(io::sink(), &mut canonical);
        body.serialize(&mut serializer).is_ok()
    }
}

/// A compact JSON formatter that writes the canonical form itself: each
/// object's entries are noted as they are written, and an object whose
/// keys came out of order is rewritten in order once it closes (its nested
/// objects already canonical). It refuses, with an I/O error that stops
/// the write, whatever the `Value` path would write differently or reject:
/// a key written twice in one object, a key that needs escaping or is not
/// a plain string, and the values `Value` changes (`f32` widens to `f64`,
/// 128-bit integers, raw JSON fragments).
struct Canonical<'a> {
    buffers: &'a mut Buffers,
    in_key: bool,
}

struct Object {
    /// Its first entry in `entries`.
    first: usize,
    /// Whether its keys came in strictly increasing order so far.
    sorted: bool,
}

/// `"key":value` in `out`: from its opening quote; its key's bytes are
/// `start + 1 .. key_end`.
#[derive(Clone, Copy)]
struct Entry {
    start: usize,
    key_end: usize,
}

fn refused() -> io::Error {
    io::Error::other("not written in one pass")
}

impl Buffers {
    fn key(&self, entry: Entry) -> &[u8] {
        key(&self.out, entry)
    }

    /// Rewrites the entries of the object that just closed in key order,
    /// or refuses a key written twice.
    fn sort_entries(&mut self, first: usize) -> io::Result<()> {
        let Buffers {
            out,
            entries,
            order,
            scratch,
            ..
        } = self;
        let entries = &entries[first..];
        let Some(content) = entries.first().map(|entry| entry.start) else {
            return Ok(());
        };
        order.clear();
        order.extend(entries.iter().enumerate().map(|(i, &entry)| {
            // Each entry ends at the comma before the next, or at the end
            // of the object's content.
            let end = entries.get(i + 1).map_or(out.len(), |next| next.start - 1);
            (entry, end)
        }));
        order.sort_unstable_by(|a, b| key(out, a.0).cmp(key(out, b.0)));
        if order
            .windows(2)
            .any(|w| key(out, w[0].0) == key(out, w[1].0))
        {
            return Err(refused());
        }
        scratch.clear();
        for (i, &(entry, end)) in order.iter().enumerate() {
            if i > 0 {
                scratch.push(b',');
            }
            scratch.extend_from_slice(&out[entry.start..end]);
        }
        out.truncate(content);
        out.extend_from_slice(scratch);
        Ok(())
    }
}

fn key(out: &[u8], entry: Entry) -> &[u8] {
    &out[entry.start + 1..entry.key_end]
}

/// Compact output for a scalar, refused inside a key (the `Value` path
/// writes non-string keys its own way).
macro_rules! scalar {
    ($($method:ident($($ty:ty)?)),* $(,)?) => {$(
        fn $method<W: ?Sized + io::Write>(&mut self, _: &mut W $(, value: $ty)?) -> io::Result<()> {
            if self.in_key {
                return Err(refused());
            }
            CompactFormatter.$method(&mut self.buffers.out $(, value as $ty)?)
        }
    )*};
}

/// Refused wherever it comes.
macro_rules! refuse {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method<W: ?Sized + io::Write>(&mut self, _: &mut W, _: $ty) -> io::Result<()> {
            Err(refused())
        }
    )*};
}

/// Written as they are.
macro_rules! punctuation {
    ($($method:ident($($first:ident)?) => $bytes:expr),* $(,)?) => {$(
        fn $method<W: ?Sized + io::Write>(&mut self, _: &mut W $(, $first: bool)?) -> io::Result<()> {
            self.buffers.out.extend_from_slice($bytes);
            Ok(())
        }
    )*};
}

impl Formatter for &mut Canonical<'_> {
    scalar!(
        write_null(),
        write_bool(bool),
        write_i8(i8),
        write_i16(i16),
        write_i32(i32),
        write_i64(i64),
        write_u8(u8),
        write_u16(u16),
        write_u32(u32),
        write_u64(u64),
        write_f64(f64),
    );

    refuse!(
        write_f32(f32),
        write_i128(i128),
        write_u128(u128),
        write_number_str(&str),
        write_raw_fragment(&str),
    );

    punctuation!(
        begin_string() => b"\"",
        end_string() => b"\"",
        begin_array() => b"[",
        end_array() => b"]",
        begin_array_value(first) => if first { b"" } else { b"," },
        end_array_value() => b"",
        begin_object_value() => b":",
        end_object_value() => b"",
    );

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        _: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        self.buffers.out.extend_from_slice(fragment.as_bytes());
        Ok(())
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        _: &mut W,
        escape: CharEscape,
    ) -> io::Result<()> {
        if self.in_key {
            // Escaped bytes sort differently from the characters they stand
            // for.
            return Err(refused());
        }
        CompactFormatter.write_char_escape(&mut self.buffers.out, escape)
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.buffers.objects.push(Object {
            first: self.buffers.entries.len(),
            sorted: true,
        });
        self.buffers.out.push(b'{');
        Ok(())
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        let object = self.buffers.objects.pop().ok_or_else(refused)?;
        if !object.sorted {
            self.buffers.sort_entries(object.first)?;
        }
        self.buffers.entries.truncate(object.first);
        self.buffers.out.push(b'}');
        Ok(())
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        _: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if !first {
            self.buffers.out.push(b',');
        }
        self.in_key = true;
        self.buffers.entries.push(Entry {
            start: self.buffers.out.len(),
            key_end: 0,
        });
        Ok(())
    }

    fn end_object_key<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.in_key = false;
        let object = self.buffers.objects.last().ok_or_else(refused)?;
        let index = self.buffers.entries.len() - 1;
        // The key's bytes end before its closing quote.
        self.buffers.entries[index].key_end = self.buffers.out.len() - 1;
        if object.sorted && index > object.first {
            let (last, this) = (self.buffers.entries[index - 1], self.buffers.entries[index]);
            match self.buffers.key(this).cmp(self.buffers.key(last)) {
                std::cmp::Ordering::Greater => {}
                std::cmp::Ordering::Equal => return Err(refused()),
                std::cmp::Ordering::Less => {
                    if let Some(object) = self.buffers.objects.last_mut() {
                        object.sorted = false;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The canonical bytes of `body` on each path: the one pass's when it
/// takes `body`, and the `Value` path's. For the fuzz targets.
#[cfg(feature = "fuzzing")]
pub fn canonical_forms<T: Serialize + ?Sized>(
    body: &T,
) -> (Option<Vec<u8>>, Result<Vec<u8>, serde_json::Error>) {
    let mut buffers = Buffers::default();
    let one_pass = buffers.write_in_one_pass(body).then_some(buffers.out);
    let mut sorted = Vec::new();
    let sorted = serde_json::to_value(body)
        .and_then(|value| write_canonical(&mut sorted, &value))
        .map(|()| sorted);
    (one_pass, sorted)
}

/// The sorting path: `value` written compactly with every object's keys in
/// order.
fn write_canonical(out: &mut Vec<u8>, value: &Value) -> Result<(), serde_json::Error> {
    match value {
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(out, item)?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // Sorted here rather than trusting the map type: serde_json's
            // `preserve_order` feature, enabled by any crate in a build,
            // would otherwise make the hash depend on insertion order.
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (name, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, name)?;
                out.push(b':');
                write_canonical(out, item)?;
            }
            out.push(b'}');
        }
        scalar => serde_json::to_writer(&mut *out, scalar)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests;
