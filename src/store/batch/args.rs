//! A script call's keys and values in one buffer, each written by redis-rs's
//! own encoding ([`ToRedisArgs`]): one allocation per call, and a form's
//! values (`store::batch`'s header) compared as one run of bytes.

use std::fmt;
use std::io::{self, Write};

use redis::RedisWrite;
#[cfg(doc)]
use redis::ToRedisArgs;

/// Bytes before each argument: its length, as a little-endian `usize`.
const LENGTH: usize = size_of::<usize>();

/// A list of script arguments (keys or values), each its length then its
/// bytes, one after the other. Self-delimiting: two lists hold the same
/// arguments exactly when their bytes are equal, and so are any two runs
/// of whole arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScriptArgs {
    bytes: Vec<u8>,
    count: usize,
}

impl ScriptArgs {
    /// An empty list with room for `count` arguments of `bytes` bytes in
    /// all.
    pub fn with_capacity(count: usize, bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes + LENGTH * count),
            count: 0,
        }
    }

    /// Appends `value`, as redis-rs would send it (a number as its
    /// decimal text).
    pub fn arg(&mut self, value: impl redis::ToRedisArgs) -> &mut Self {
        value.write_redis_args(self);
        self
    }

    /// How many arguments it holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Does it hold none?
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Its arguments, in order.
    pub fn iter(&self) -> Args<'_> {
        Args { rest: &self.bytes }
    }

    /// The bytes of its arguments after the first `skip`: what tells two
    /// lists' tails apart or equal.
    pub(super) fn bytes_after(&self, skip: usize) -> &[u8] {
        let mut args = self.iter();
        for _ in 0..skip {
            args.next();
        }
        args.rest
    }

    /// The bytes it holds in all, lengths included: room enough to send
    /// them.
    pub(super) fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// Starts an argument: its length comes when it is complete
    /// ([`ScriptArgs::close`]).
    fn open(&mut self) -> usize {
        self.bytes.extend_from_slice(&[0; LENGTH]);
        self.bytes.len()
    }

    /// Completes the argument [`ScriptArgs::open`] started at `start`.
    fn close(&mut self, start: usize) {
        let length = self.bytes.len() - start;
        self.bytes[start - LENGTH..start].copy_from_slice(&length.to_le_bytes());
        self.count += 1;
    }
}

impl RedisWrite for ScriptArgs {
    fn write_arg(&mut self, arg: &[u8]) {
        self.bytes.extend_from_slice(&arg.len().to_le_bytes());
        self.bytes.extend_from_slice(arg);
        self.count += 1;
    }

    fn write_arg_fmt(&mut self, arg: impl fmt::Display) {
        let start = self.open();
        // Writing into a Vec cannot fail.
        let _infallible = write!(self.bytes, "{arg}");
        self.close(start);
    }

    fn writer_for_next_arg(&mut self) -> impl Write + '_ {
        let start = self.open();
        NextArg { args: self, start }
    }
}

/// The argument being written through [`RedisWrite::writer_for_next_arg`]:
/// its length is written when it is dropped.
struct NextArg<'a> {
    args: &'a mut ScriptArgs,
    start: usize,
}

impl Write for NextArg<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.args.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for NextArg<'_> {
    fn drop(&mut self) {
        self.args.close(self.start);
    }
}

/// The arguments of a [`ScriptArgs`], in order.
#[derive(Debug, Clone)]
pub struct Args<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Args<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let (length, rest) = self.rest.split_first_chunk::<LENGTH>()?;
        let (arg, rest) = rest.split_at_checked(usize::from_le_bytes(*length))?;
        self.rest = rest;
        Some(arg)
    }
}

impl<'a> IntoIterator for &'a ScriptArgs {
    type Item = &'a [u8];
    type IntoIter = Args<'a>;

    fn into_iter(self) -> Args<'a> {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_come_back_as_redis_rs_would_send_them() {
        let mut args = ScriptArgs::default();
        args.arg("key")
            .arg(12_u64)
            .arg(0.25_f64)
            .arg("")
            .arg(b"\x00\xff".as_slice());
        {
            let mut writer = args.writer_for_next_arg();
            writer.write_all(b"writ").expect("a Vec");
            writer.write_all(b"ten").expect("a Vec");
        }
        args.write_arg_fmt(-3);
        let read: Vec<&[u8]> = args.iter().collect();
        let expected: [&[u8]; 7] = [b"key", b"12", b"0.25", b"", b"\x00\xff", b"written", b"-3"];
        assert_eq!(read, expected);
        assert_eq!(args.len(), 7);

        let mut redis = redis::Cmd::new();
        redis.arg("key").arg(12_u64).arg(0.25_f64);
        let sent: Vec<&[u8]> = crate::store::script_values(&redis).collect();
        assert_eq!(read[..3], sent[..]);
    }

    #[test]
    fn equal_tails_are_equal_bytes() {
        let list = |args: &[&str]| {
            let mut list = ScriptArgs::default();
            for arg in args {
                list.arg(*arg);
            }
            list
        };
        let a = list(&["a", "fw", "10"]);
        let b = list(&["bb", "fw", "10"]);
        assert_eq!(a.bytes_after(1), b.bytes_after(1));
        // The same bytes cut into other arguments are other arguments.
        assert_ne!(a.bytes_after(1), list(&["a", "fw1", "0"]).bytes_after(1));
        assert_ne!(a.bytes_after(1), list(&["a", "f", "w10"]).bytes_after(1));
        assert!(a.bytes_after(3).is_empty() && a.bytes_after(9).is_empty());
    }
}
