//! Linker settings for a Node addon (on macOS, N-API's symbols are left to
//! the loading process).

fn main() {
    napi_build::setup();
}
