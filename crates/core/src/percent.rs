//! Percent-encoding of keys and values on the command line, in the control protocol and in
//! `scan` output: every byte outside printable ASCII, plus `%` itself, becomes `%XX`.

use crate::error::{Error, Result};

/// `bytes` as text: the printable ASCII bytes other than `%` as they are, every other byte
/// (space, `%`, control and non-ASCII bytes) as `%XX` in upper-case hex. The text holds no
/// whitespace.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if (0x21..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The bytes [`encode`] made `text` from: each `%XX` (either case) is one byte, any other
/// character stands for itself. A `%` not followed by two hex digits is
/// [`Error::Invalid`].
pub fn decode(text: &str) -> Result<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "bad percent-escape at byte {i} of {text:?} (expected %XX with two hex digits)"
                    ))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let text = encode(&all);
        assert!(!text.contains(' ') && !text.contains('\n') && !text.contains('\t'));
        assert_eq!(decode(&text).unwrap(), all);
    }

    #[test]
    fn documented_escapes() {
        assert_eq!(encode(b"a b%c"), "a%20b%25c");
        assert_eq!(decode("a%20b%25c").unwrap(), b"a b%c");
        assert_eq!(decode("%ff%FF").unwrap(), vec![255, 255]);
    }

    #[test]
    fn rejects_broken_escapes() {
        for bad in ["%", "%4", "%zz", "a%2", "%+1", "%-1"] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
    }
}
