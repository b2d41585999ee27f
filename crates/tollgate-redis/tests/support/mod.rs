//! Test support: the redis-server process helpers (shared crate) and the conformance suite.

#![allow(dead_code, unused_imports)]

pub use tollgate_testsupport::*;

pub mod conformance;
