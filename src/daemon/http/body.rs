//! Request bodies: a JSON object (strict: a key twice is refused), then the
//! operation's typed request.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::Response;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::problem::plain;
use crate::daemon::BODY_BYTES_MAX;

/// A request's body as the handlers take it (axum's rejection kept, to answer it
/// as a problem).
pub(super) type Body = Result<Bytes, BytesRejection>;

/// A request refused before it reached an operation (boxed: a response is large).
pub(super) type Reject = Box<Response>;

/// The JSON object of a request body (empty: `{}`), or the problem.
pub(super) fn body_object(body: Body) -> Result<serde_json::Map<String, Value>, Reject> {
    let bytes = body.map_err(|rej| {
        Box::new(if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
            plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "BODY_TOO_LARGE",
                &format!("a request body is at most {BODY_BYTES_MAX} bytes"),
            )
        } else {
            plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", &rej.body_text())
        })
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    match strict_json(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Box::new(plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", "the body is a JSON object"))),
        Err(e) => Err(Box::new(plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", &format!("the body is not JSON: {e}")))),
    }
}

/// JSON as `serde_json` reads it, but a key twice in one object is an error (JSON
/// parsers disagree on which one wins: refused, never guessed).
fn strict_json(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    struct Strict(Value);
    impl<'de> serde::Deserialize<'de> for Strict {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
            d.deserialize_any(StrictVisitor).map(Strict)
        }
    }
    struct StrictVisitor;
    impl<'de> serde::de::Visitor<'de> for StrictVisitor {
        type Value = Value;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_none<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            Strict::deserialize(d).map(|s| s.0)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
            let mut v = Vec::new();
            while let Some(Strict(x)) = a.next_element()? {
                v.push(x);
            }
            Ok(Value::Array(v))
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
            let mut m = serde_json::Map::new();
            while let Some(k) = a.next_key::<String>()? {
                let Strict(v) = a.next_value()?;
                if m.insert(k.clone(), v).is_some() {
                    return Err(serde::de::Error::custom(format!("the key {k:?} appears twice in one object")));
                }
            }
            Ok(Value::Object(m))
        }
    }
    use serde::Deserialize;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let Strict(v) = Strict::deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

pub(super) fn typed<T: DeserializeOwned>(m: serde_json::Map<String, Value>) -> Result<T, Reject> {
    serde_json::from_value(Value::Object(m))
        .map_err(|e| Box::new(plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", &format!("invalid request: {e}"))))
}
