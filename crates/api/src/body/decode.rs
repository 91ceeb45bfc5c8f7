//! Decoding a compressed ingest body, for subscriptions whose `content_encodings` accept one
//! (docs/limits.md): the decoded bytes are bounded by `max_decompressed_bytes` and by
//! `max_decompression_ratio` times the received bytes, whichever is smaller, and take their share of
//! the [`IngestGate`]'s byte budget as they are produced, so a decompression bomb stops at the cap
//! having cost at most the cap.

use std::io::Read;

use bytes::Bytes;
use http::HeaderMap;
use tb_core::limits::{ContentCoding, Exceeded, Limits};

use super::gate::IngestGate;
use super::read::Accounted;

/// Bytes decoded (and reserved from the budget) at a time.
const STEP: usize = 64 * 1024;

/// What the `Content-Encoding` of a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// None, or only `identity`.
    Identity,
    /// One coding these limits accept.
    Accepted(ContentCoding),
    /// A coding not accepted, or more than one coding (a stack of codings is a way to multiply a
    /// bomb): 415, left to the connector, which refuses every coding.
    Refused,
}

/// The coding of a request under `limits`.
pub fn coding_of(headers: &HeaderMap, limits: &Limits) -> Coding {
    let mut found = None;
    for value in headers.get_all(http::header::CONTENT_ENCODING) {
        let Ok(s) = value.to_str() else {
            return Coding::Refused;
        };
        for token in s.split(',').map(str::trim) {
            if token.is_empty() || token.eq_ignore_ascii_case("identity") {
                continue;
            }
            match ContentCoding::parse(token) {
                Some(c) if found.is_none() && limits.accepts(c) => found = Some(c),
                _ => return Coding::Refused,
            }
        }
    }
    found.map_or(Coding::Identity, Coding::Accepted)
}

/// The request as its connector sees it: with an accepted coding, the decoded body and the headers
/// without `Content-Encoding` (as if sent without a coding); otherwise both as sent (a refused coding
/// is the connector's 415). Err: the refusal's outcome (`too_large`, `rejected`, `overloaded`) and
/// its answer (413, 400, 503 with `Retry-After`), boxed: the refusal is the rare path and the
/// answer is large.
pub fn decode_request(
    body: Bytes,
    mut headers: HeaderMap,
    limits: &Limits,
    max_body_bytes: usize,
    gate: &IngestGate,
) -> Result<(Bytes, HeaderMap), (&'static str, Box<axum::response::Response>)> {
    use axum::response::IntoResponse;
    let Coding::Accepted(coding) = coding_of(&headers, limits) else {
        return Ok((body, headers));
    };
    match decode(&body, coding, limits, max_body_bytes, gate) {
        Ok(decoded) => {
            headers.remove(http::header::CONTENT_ENCODING);
            Ok((decoded, headers))
        }
        Err(DecodeError::Exceeded(x)) => Err((
            "too_large",
            Box::new(crate::error::ApiError(x.error()).into_response()),
        )),
        Err(DecodeError::Corrupt) => Err((
            "rejected",
            Box::new(
                crate::error::ApiError::new(
                    tb_core::ErrorCode::ValidationError,
                    "the body is not valid for its Content-Encoding",
                )
                .into_response(),
            ),
        )),
        Err(DecodeError::Busy) => Err((
            "overloaded",
            Box::new(super::ReadError::Busy.into_response(max_body_bytes)),
        )),
    }
}

/// Why a body was not decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Over `max_decompressed_bytes` or `max_decompression_ratio` (413).
    Exceeded(Exceeded),
    /// The bytes are not a valid stream of the coding (400 `validation_error`).
    Corrupt,
    /// The byte budget is spent (503 `unavailable`, `Retry-After: 1`).
    Busy,
}

/// Decodes `body` (`coding`) under `limits`, `max_body_bytes` being the subscription's body limit
/// (the default of `max_decompressed_bytes`). The decoded bytes keep their budget share for as long
/// as they live, like [`super::read_ingest`]'s.
pub fn decode(
    body: &[u8],
    coding: ContentCoding,
    limits: &Limits,
    max_body_bytes: usize,
    gate: &IngestGate,
) -> Result<Bytes, DecodeError> {
    let by_size = limits.max_decompressed_bytes.unwrap_or(max_body_bytes);
    let by_ratio = body
        .len()
        .max(1)
        .saturating_mul(limits.max_decompression_ratio as usize);
    let (cap, which) = if by_ratio < by_size {
        (by_ratio, Exceeded::DecompressionRatio)
    } else {
        (by_size, Exceeded::DecompressedBytes)
    };
    let mut reader: Box<dyn Read + '_> = match coding {
        ContentCoding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(body)),
    };
    let mut out: Vec<u8> = Vec::new();
    let mut held: Option<tokio::sync::OwnedSemaphorePermit> = None;
    loop {
        if out.len() > cap {
            metrics::counter!("tb_http_refused_total", "reason" => "decompression_cap")
                .increment(1);
            return Err(DecodeError::Exceeded(which));
        }
        // Room for one more step, reserved before it is filled; one byte past the cap tells.
        let step = STEP.min(cap + 1 - out.len());
        let more = gate
            .budget
            .clone()
            .try_acquire_many_owned(step as u32)
            .map_err(|_| {
                metrics::counter!("tb_http_refused_total", "reason" => "body_budget").increment(1);
                DecodeError::Busy
            })?;
        match &mut held {
            Some(h) => h.merge(more),
            None => held = Some(more),
        }
        let start = out.len();
        out.resize(start + step, 0);
        let mut filled = 0;
        while filled < step {
            match reader.read(&mut out[start + filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(_) => return Err(DecodeError::Corrupt),
            }
        }
        out.truncate(start + filled);
        if filled < step {
            break;
        }
    }
    if out.len() > cap {
        return Err(DecodeError::Exceeded(which));
    }
    // Give back the unused part of the last step's reservation.
    if let Some(h) = &mut held {
        let used = out.len() as u32;
        if let Some(extra) = h.num_permits().checked_sub(used as usize) {
            if extra > 0 {
                drop(h.split(extra));
            }
        }
    }
    out.shrink_to_fit();
    Ok(Bytes::from_owner(Accounted {
        data: out,
        _bytes: held,
    }))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn gzip_ok() -> Limits {
        Limits {
            content_encodings: vec![ContentCoding::Gzip],
            ..Limits::default()
        }
    }

    #[test]
    fn a_body_within_its_limits_decodes_and_holds_its_bytes_of_the_budget() {
        let gate = IngestGate::new(4, 10 << 20);
        let plain = br#"{"action":"opened"}"#.repeat(100);
        let d = decode(&gz(&plain), ContentCoding::Gzip, &gzip_ok(), 1 << 20, &gate).unwrap();
        assert_eq!(&d[..], &plain[..]);
        assert_eq!(gate.budget_available(), (10 << 20) - plain.len());
        drop(d);
        assert_eq!(gate.budget_available(), 10 << 20);
    }

    #[test]
    fn a_bomb_stops_at_the_ratio_or_the_size_cap_and_gives_its_budget_back() {
        let gate = IngestGate::new(4, 64 << 20);
        // 50 MiB of zeros compress to ~50 KiB: a ratio of ~1000.
        let bomb = gz(&vec![0u8; 50 << 20]);
        assert!(bomb.len() < 100 * 1024, "{}", bomb.len());
        let r = decode(&bomb, ContentCoding::Gzip, &gzip_ok(), 1 << 30, &gate);
        assert_eq!(r, Err(DecodeError::Exceeded(Exceeded::DecompressionRatio)));
        let tight = Limits {
            max_decompression_ratio: 100_000,
            max_decompressed_bytes: Some(1 << 20),
            ..gzip_ok()
        };
        let r = decode(&bomb, ContentCoding::Gzip, &tight, 1 << 30, &gate);
        assert_eq!(r, Err(DecodeError::Exceeded(Exceeded::DecompressedBytes)));
        assert_eq!(gate.budget_available(), 64 << 20, "nothing kept");
        // The default size cap is the body limit.
        let loose = Limits {
            max_decompression_ratio: 100_000,
            ..gzip_ok()
        };
        let r = decode(&gz(&[b'x'; 5000]), ContentCoding::Gzip, &loose, 4096, &gate);
        assert_eq!(r, Err(DecodeError::Exceeded(Exceeded::DecompressedBytes)));
    }

    #[test]
    fn corrupt_streams_and_a_spent_budget_are_refused() {
        let gate = IngestGate::new(4, 1 << 20);
        let mut bad = gz(b"hello world");
        let n = bad.len();
        bad[n / 2] ^= 0xff;
        bad.truncate(n - 3);
        assert_eq!(
            decode(&bad, ContentCoding::Gzip, &gzip_ok(), 1 << 20, &gate),
            Err(DecodeError::Corrupt)
        );
        let small = IngestGate::new(4, 10);
        assert_eq!(
            decode(
                &gz(&[b'y'; 100]),
                ContentCoding::Gzip,
                &gzip_ok(),
                1 << 20,
                &small
            ),
            Err(DecodeError::Busy)
        );
    }

    #[test]
    fn the_coding_is_read_from_every_content_encoding_value() {
        let h = |vals: &[&str]| {
            let mut m = HeaderMap::new();
            for v in vals {
                m.append(http::header::CONTENT_ENCODING, v.parse().unwrap());
            }
            m
        };
        let ok = gzip_ok();
        assert_eq!(coding_of(&h(&[]), &ok), Coding::Identity);
        assert_eq!(coding_of(&h(&["identity"]), &ok), Coding::Identity);
        assert_eq!(
            coding_of(&h(&["GZIP"]), &ok),
            Coding::Accepted(ContentCoding::Gzip)
        );
        assert_eq!(coding_of(&h(&["gzip, gzip"]), &ok), Coding::Refused);
        assert_eq!(coding_of(&h(&["gzip", "gzip"]), &ok), Coding::Refused);
        assert_eq!(coding_of(&h(&["br"]), &ok), Coding::Refused);
        assert_eq!(
            coding_of(&h(&["gzip"]), &Limits::default()),
            Coding::Refused,
            "not accepted unless configured"
        );
    }
}
