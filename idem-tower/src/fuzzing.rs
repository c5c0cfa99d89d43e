//! Entry points for the fuzz targets in `idem-fuzz`; not a stable API.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

use crate::response::{self, Stored, Unreplayable};

/// An error from a parser, as its own type reports it.
pub type Refused = Box<dyn std::error::Error + Send + Sync>;

/// Decodes a stored response as a replay does, and encodes what it decoded
/// again.
pub fn stored_response(payload: &[u8]) -> Result<Vec<u8>, Refused> {
    Ok(match response::decode(payload)? {
        Stored::Response {
            status,
            headers,
            body,
        } => response::encode(status, &headers, &body),
        Stored::Unreplayable(why) => response::encode_unreplayable(why),
    })
}

/// Encodes a response as the layer stores it; `None` when `http` refuses
/// the status or a header.
pub fn encode_response(status: u16, headers: &[(&str, &[u8])], body: &[u8]) -> Option<Vec<u8>> {
    let status = StatusCode::from_u16(status).ok()?;
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).ok()?,
            HeaderValue::from_bytes(value).ok()?,
        );
    }
    Some(response::encode(status, &map, body))
}

/// The markers stored for a request that ran without a replayable response.
pub fn encode_unreplayable() -> [Vec<u8>; 2] {
    [Unreplayable::TooLarge, Unreplayable::BodyFailed].map(response::encode_unreplayable)
}

/// Reads the key from one `Idempotency-Key` header line holding `value`:
/// `None` when `http` refuses the value as a header value.
pub fn idempotency_key(value: &[u8]) -> Option<Result<Option<String>, String>> {
    let name = HeaderName::from_static("idempotency-key");
    let mut headers = HeaderMap::new();
    headers.insert(name.clone(), HeaderValue::from_bytes(value).ok()?);
    Some(crate::request::client_key(&headers, &name).map_err(|error| error.detail(&name)))
}
