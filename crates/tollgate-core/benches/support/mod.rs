//! Shared by the core bench (`benches/core.rs`) and the instruction-count harness
//! (`examples/hotpath.rs`), so both measure exactly the same keys.

/// `n` distinct keys shaped like a per-IP counter: `api|ip=10.x.y.z`.
pub fn keys(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            format!(
                "api|ip=10.{}.{}.{}",
                (i >> 16) & 255,
                (i >> 8) & 255,
                i & 255
            )
        })
        .collect()
}
