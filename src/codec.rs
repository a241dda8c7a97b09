//! The protobuf codec of ratelimitd's own two services (`RateLimiter` and
//! Envoy's `RateLimitService`): tonic-prost's, except that a message that
//! does not decode is the caller's fault, `INVALID_ARGUMENT`, rather than
//! the `INTERNAL` gRPC libraries answer by default.
//!
//! Why: the API promises `INVALID_ARGUMENT` for bad input and keeps
//! `INTERNAL` for Redis surprises, so an operator alerting on `INTERNAL`
//! is not paged by a fuzzer or a client with a stale schema. Errors in the
//! gRPC framing around the message (a compressed flag without
//! `grpc-encoding`, a body cut short) are raised by tonic before any codec
//! runs and stay `INTERNAL`, as the gRPC specification requires for them.
//! The generated clients use this codec too; for them it only changes the
//! code of an undecodable reply.
//!
//! Its buffers also start small: tonic allocates a codec's buffer size
//! for every call's request and again for its response, 8 KiB each by
//! default, where these messages take tens to hundreds of bytes. A buffer
//! still grows as a larger message needs.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The buffer each call's request and response start with. Under glibc's
/// malloc, a block below 1 KiB comes from the thread's cache; a larger one
/// is found among the free blocks, often after merging the small ones
/// freed since.
const BUFFER_BYTES: usize = 512;

/// How much of a streamed response tonic gathers before it writes: its
/// own default.
const YIELD_BYTES: usize = 32 * 1024;

fn buffer_settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_BYTES)
}

/// A [`Codec`] for `application/grpc+proto` that answers an undecodable
/// message with `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub(crate) struct StrictProstCodec<T, U> {
    _messages: PhantomData<(T, U)>,
}

impl<T, U> Default for StrictProstCodec<T, U> {
    fn default() -> Self {
        Self {
            _messages: PhantomData,
        }
    }
}

impl<T, U> Codec for StrictProstCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(buffer_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(ProstDecoder::new(buffer_settings()))
    }
}

/// tonic-prost's decoder with its error code changed.
#[derive(Debug, Clone)]
pub(crate) struct StrictDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            Status::invalid_argument(format!(
                "request: not a valid protobuf message: {}",
                status.message()
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
