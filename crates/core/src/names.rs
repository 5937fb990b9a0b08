//! Backend names: `<operator>/<subtask>`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::Error;

/// The name of a hosted backend, e.g. `Operator-2/1`.
///
/// The operator is 1..=255 bytes of ASCII letters, digits, `-`, `_` and `.`, and not `.` or
/// `..`; the subtask is a non-negative decimal integer without leading zeros. The canonical
/// text form is also the backend's relative path everywhere (state dir, mount, restore).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendName {
    operator: String,
    subtask: u32,
}

impl BackendName {
    /// The backend `operator/subtask`; an operator outside the rules is
    /// [`Error::InvalidBackendName`].
    pub fn new(operator: &str, subtask: u32) -> Result<Self, Error> {
        validate_operator(operator)?;
        Ok(BackendName {
            operator: operator.to_string(),
            subtask,
        })
    }

    /// The operator part: one path component.
    pub fn operator(&self) -> &str {
        &self.operator
    }

    /// The subtask part.
    pub fn subtask(&self) -> u32 {
        self.subtask
    }

    /// Relative path `<operator>/<subtask>`.
    pub fn rel_path(&self) -> std::path::PathBuf {
        std::path::Path::new(&self.operator).join(self.subtask.to_string())
    }
}

/// Operator names are one path component of a conservative character set.
pub fn validate_operator(operator: &str) -> Result<(), Error> {
    let bad = |reason| Error::InvalidBackendName {
        name: operator.to_string(),
        reason,
    };
    if operator.is_empty() {
        return Err(bad("the operator is empty"));
    }
    if operator.len() > 255 {
        return Err(bad("the operator is longer than 255 bytes"));
    }
    if operator == "." || operator == ".." {
        return Err(bad("the operator may not be '.' or '..'"));
    }
    if !operator
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(bad(
            "the operator may only hold ASCII letters, digits, '-', '_' and '.'",
        ));
    }
    Ok(())
}

/// Subtasks are decimal without leading zeros, so each backend has one spelling.
pub fn parse_subtask(text: &str) -> Result<u32, Error> {
    let bad = |reason| Error::InvalidBackendName {
        name: text.to_string(),
        reason,
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("the subtask must be a non-negative decimal integer"));
    }
    if text.len() > 1 && text.starts_with('0') {
        return Err(bad("the subtask may not have leading zeros"));
    }
    text.parse()
        .map_err(|_| bad("the subtask is larger than 4294967295"))
}

impl FromStr for BackendName {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let (operator, subtask) = text.split_once('/').ok_or(Error::InvalidBackendName {
            name: text.to_string(),
            reason: "expected <operator>/<subtask>, e.g. Operator-2/1",
        })?;
        if subtask.contains('/') {
            return Err(Error::InvalidBackendName {
                name: text.to_string(),
                reason: "expected exactly one '/'",
            });
        }
        let subtask = parse_subtask(subtask)?;
        BackendName::new(operator, subtask)
    }
}

impl fmt::Display for BackendName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.operator, self.subtask)
    }
}

impl Serialize for BackendName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for BackendName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        let name: BackendName = "Operator-2/1".parse().unwrap();
        assert_eq!(name.operator(), "Operator-2");
        assert_eq!(name.subtask(), 1);
        assert_eq!(name.to_string(), "Operator-2/1");
        assert!("a.b_c-d/0".parse::<BackendName>().is_ok());
    }

    #[test]
    fn refuses_what_could_escape_or_be_ambiguous() {
        for bad in [
            "",
            "op",
            "/1",
            "op/",
            "../1",
            "./1",
            "a/b/1",
            "op/-1",
            "op/01",
            "op/x",
            "op 1/1",
            "op\0/1",
            "op/99999999999",
        ] {
            assert!(bad.parse::<BackendName>().is_err(), "{bad:?} was accepted");
        }
        let long = format!("{}/1", "a".repeat(256));
        assert!(long.parse::<BackendName>().is_err());
        let ok = format!("{}/1", "a".repeat(255));
        assert!(ok.parse::<BackendName>().is_ok());
    }
}
