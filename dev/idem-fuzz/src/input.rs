//! The byte formats the targets read their inputs in, and their writers for
//! the seeds.

/// Reads fields off the front of a fuzz input; `None` once it runs out.
#[derive(Debug)]
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        if self.0.len() < len {
            return None;
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.array().map(u8::from_be_bytes)
    }

    pub(crate) fn i16(&mut self) -> Option<i16> {
        self.array().map(i16::from_be_bytes)
    }

    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_be_bytes)
    }

    pub(crate) fn i64(&mut self) -> Option<i64> {
        self.array().map(i64::from_be_bytes)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_be_bytes)
    }

    /// Bytes after a one-byte length.
    pub(crate) fn short(&mut self) -> Option<&'a [u8]> {
        let len = self.u8()?;
        self.take(len.into())
    }

    /// Bytes after a two-byte length.
    pub(crate) fn long(&mut self) -> Option<&'a [u8]> {
        let len = self.u16()?;
        self.take(len.into())
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
}

/// Writes what [`Reader`] reads.
#[derive(Debug, Default)]
pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    pub(crate) fn put(&mut self, bytes: &[u8]) -> &mut Writer {
        self.0.extend_from_slice(bytes);
        self
    }

    pub(crate) fn short(&mut self, bytes: &[u8]) -> &mut Writer {
        let len = u8::try_from(bytes.len()).expect("a short field fits 255 bytes");
        self.put(&[len]).put(bytes)
    }

    pub(crate) fn long(&mut self, bytes: &[u8]) -> &mut Writer {
        let len = u16::try_from(bytes.len()).expect("a long field fits 65535 bytes");
        self.put(&len.to_be_bytes()).put(bytes)
    }
}
