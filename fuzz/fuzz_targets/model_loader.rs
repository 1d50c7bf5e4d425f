//! Feeds arbitrary bytes to the model.json parser and to the safetensors reader. The first byte
//! picks the target (even: model.json, odd: safetensors), the rest is the input. Either loader
//! must answer with a value or an error, never panic, hang or allocate without bound.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which % 2 == 0 {
        // Invalid UTF-8 is rejected before parsing, as `load_model` does when reading the file.
        if let Ok(text) = std::str::from_utf8(rest) {
            let _ = mlpc_frontend::parse_model(text, Path::new("/nonexistent/mlpc-fuzz"), "fuzz.json");
        }
    } else {
        let _ = mlpc_frontend::parse_tensors(rest, Path::new("fuzz.safetensors"));
    }
});
