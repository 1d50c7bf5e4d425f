//! On / off switches read from the environment (`MLPC_NO_GRAPHS=1`, ...): one reading of their
//! values for every switch of every crate, so that `MLPC_X=false` never means "on".

use std::ffi::OsStr;

/// The switches this crate reads: [`crate::graphs_by_default`], [`crate::early_launch_by_default`].
pub const RUNTIME_SWITCHES: [&str; 2] = ["MLPC_NO_GRAPHS", "MLPC_NO_EARLY_LAUNCH"];

/// A switch whose value is none of the accepted spellings.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "environment variable {name}={value:?}: expected 1 or 0 (or true / false, on / off, yes / \
     no; empty is the same as unset)"
)]
pub struct SwitchError {
    pub name: String,
    pub value: String,
}

/// The switch `name`: `Ok(None)` when unset or empty, `Ok(Some(true))` for `1`, `true`, `on`,
/// `yes`, `Ok(Some(false))` for `0`, `false`, `off`, `no` (any case, blanks around them
/// ignored), an error for anything else, a value that is not UTF-8 included.
pub fn switch(name: &str) -> Result<Option<bool>, SwitchError> {
    match std::env::var_os(name) {
        None => Ok(None),
        Some(value) => parse_switch(name, &value),
    }
}

/// The switch `name` where a value [`switch`] refuses reads as unset: for the readers of a
/// default, whose callers report refused values first (`mlpc::check_environment`).
pub fn switch_setting(name: &str) -> Option<bool> {
    switch(name).ok().flatten()
}

/// [`switch`] of a given value.
pub fn parse_switch(name: &str, value: &OsStr) -> Result<Option<bool>, SwitchError> {
    let word = value.to_str().map(|v| v.trim().to_ascii_lowercase());
    match word.as_deref() {
        Some("") => Ok(None),
        Some("1" | "true" | "on" | "yes") => Ok(Some(true)),
        Some("0" | "false" | "off" | "no") => Ok(Some(false)),
        _ => Err(SwitchError {
            name: name.to_string(),
            value: value.to_string_lossy().into_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spellings_of_a_switch() {
        let read = |v: &str| parse_switch("MLPC_X", OsStr::new(v));
        for v in ["", " ", "\t"] {
            assert_eq!(read(v), Ok(None), "{v:?}");
        }
        for v in ["1", "true", "TRUE", " on ", "Yes"] {
            assert_eq!(read(v), Ok(Some(true)), "{v:?}");
        }
        for v in ["0", "false", "Off", "no", " 0\n"] {
            assert_eq!(read(v), Ok(Some(false)), "{v:?}");
        }
        for v in ["2", "abc", "-1", "enable", "00", "y"] {
            let e = read(v).unwrap_err();
            assert_eq!(e.name, "MLPC_X");
            assert!(
                e.to_string().starts_with("environment variable MLPC_X="),
                "{e}"
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_value_that_is_not_utf8_is_refused() {
        use std::os::unix::ffi::OsStrExt;
        let e = parse_switch("MLPC_X", OsStr::from_bytes(b"1\xff")).unwrap_err();
        assert_eq!(e.value, "1\u{fffd}");
    }
}
