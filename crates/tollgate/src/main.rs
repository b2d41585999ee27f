//! The `tollgate` binary: to be written.
fn main() {}
