//! The duration values of the command line's flags (`10s`, `500ms`, `2m`), shared by every
//! command's arguments.

use std::time::Duration;

/// A duration flag such as `10s`, `500ms`, `2m` or `0s` ([`crate::bench::parse_duration`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AnyDuration(pub(crate) Duration);

impl std::str::FromStr for AnyDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        crate::bench::parse_duration(text).map(AnyDuration)
    }
}

/// A duration flag as [`AnyDuration`], not zero.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PositiveDuration(pub(crate) Duration);

impl std::str::FromStr for PositiveDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let AnyDuration(d) = text.parse()?;
        if d.is_zero() {
            return Err(format!(
                "'{text}' is zero: use a positive duration such as 10s"
            ));
        }
        Ok(PositiveDuration(d))
    }
}
